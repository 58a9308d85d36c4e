package istiolab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Restarts as a cluster makes them: a DaemonSet rollout of the daemon
// (StartZtunnel with a new Name beside the old pod, then TerminateZtunnel
// of the old one, the chart's maxSurge 1 and maxUnavailable 0) and
// istiod's pod going away and coming back (StopIstiod, StartIstiod).

// ZtunnelGrace is the chart's terminationGracePeriodSeconds for the daemon's
// pod (also its TERMINATION_GRACE_PERIOD_SECONDS): how long a kubelet waits
// after SIGTERM before it kills the daemon. The daemon's drain deadline is 5 s
// shorter, as ztunnel's.
const ZtunnelGrace = 30 * time.Second

// TerminateZtunnel ends z as a kubelet ends a deleted DaemonSet pod: the Pod
// object is marked for deletion (the DaemonSet controller's graceful delete),
// the daemon gets SIGTERM and up to grace to drain and exit, then SIGKILL;
// once it is gone the object is removed, as the kubelet confirms the
// deletion. It returns an error if the daemon had to be killed.
func (cp *ControlPlane) TerminateZtunnel(ctx context.Context, z *Ztunnel, grace time.Duration) error {
	if _, err := cp.Kubectl(ctx, "", "delete", "pod", z.Name, "-n", IstioNamespace, "--wait=false",
		fmt.Sprintf("--grace-period=%d", int(grace/time.Second))); err != nil {
		return err
	}
	stopErr := z.proc.stop(grace)
	_, err := cp.Kubectl(ctx, "", "delete", "pod", z.Name, "-n", IstioNamespace, "--grace-period=0", "--force", "--ignore-not-found")
	return errors.Join(stopErr, err)
}

// Exited is closed when the daemon's process has ended.
func (z *Ztunnel) Exited() <-chan struct{} { return z.proc.exited }

// StopIstiod ends istiod as its pod's deletion does (SIGTERM, then SIGKILL
// after the grace period). The daemons keep serving from their last state;
// StartIstiod brings it back.
func (cp *ControlPlane) StopIstiod() error {
	i := slices.IndexFunc(cp.procs, func(p *process) bool { return p.name == "istiod" })
	if i < 0 {
		return errors.New("istiolab: istiod is not running")
	}
	p := cp.procs[i]
	cp.procs = slices.Delete(cp.procs, i, i+1)
	return p.stop(stopGrace)
}

// StartIstiod starts istiod again after StopIstiod, with the same
// arguments, working directory and log (appended), and returns once it is
// ready. Its CA is the one it made at first start: istiod keeps it in the
// istio-ca-secret Secret and reads it back, as a restarted pod does.
func (cp *ControlPlane) StartIstiod(ctx context.Context) error {
	if slices.ContainsFunc(cp.procs, func(p *process) bool { return p.name == "istiod" }) {
		return errors.New("istiolab: istiod is running")
	}
	return cp.startIstiod(ctx)
}
