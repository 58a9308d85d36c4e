package istiolab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Restarts and rotations as a cluster makes them: a DaemonSet rollout of
// the daemon (StartZtunnel with a new Name beside the old pod, then
// TerminateZtunnel of the old one, the chart's maxSurge 1 and
// maxUnavailable 0); istiod's pod going away and coming back (StopIstiod,
// StartIstiod); a CA plugged into istiod and rotated (PlugCA), with the
// kubelet's part of it (the daemons' mounted istio-ca-root-cert synced,
// mountConfigMap).

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

// CACerts are the files of the cacerts Secret an operator writes to plug a
// CA into istiod (Istio's plugin-CA task), each PEM.
type CACerts struct {
	// CACert and CAKey are the signing certificate and its key.
	CACert, CAKey []byte
	// CertChain is the chain from CACert to the root, CACert first.
	CertChain []byte
	// RootCert is the trust bundle: one root, or several during a root
	// rotation.
	RootCert []byte
	// CRL is ca-crl.pem, the plugged CA's revocation lists (PEM, optional):
	// istiod loads it with the CA, reloads it when it changes and writes it
	// into every namespace's istio-ca-crl ConfigMap (SyncZtunnelCRL).
	CRL []byte
}

// PlugCA writes the cacerts Secret in IstioNamespace and its files where the
// istio-discovery chart mounts it for istiod (./etc/cacerts, relative to its
// working directory), swapped in at once as a kubelet updates a Secret
// volume (a ..data symlink replaced), so istiod's file watcher sees one
// change. istiod takes a plugged-in CA when it starts (StopIstiod, PlugCA,
// StartIstiod, as after creating the Secret); running with one, it reloads
// a new signing certificate under the same trust bundle by itself.
func (cp *ControlPlane) PlugCA(ctx context.Context, c CACerts) error {
	files := map[string][]byte{
		"ca-cert.pem": c.CACert, "ca-key.pem": c.CAKey, "cert-chain.pem": c.CertChain, "root-cert.pem": c.RootCert,
	}
	if len(c.CRL) > 0 {
		files["ca-crl.pem"] = c.CRL
	}
	data := map[string][]byte{}
	for name, b := range files {
		if len(b) == 0 {
			return fmt.Errorf("istiolab: PlugCA: %s is empty", name)
		}
		data[name] = b // JSON encodes []byte as base64, a Secret's data
	}
	if err := cp.apply(ctx, map[string]any{
		"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
		"metadata": map[string]any{"name": "cacerts", "namespace": IstioNamespace},
		"data":     data,
	}); err != nil {
		return err
	}
	return writeVolume(filepath.Join(cp.dir("istiod"), "etc", "cacerts"), files)
}

// writeVolume updates the files of a Secret or ConfigMap volume in dir as
// the kubelet's atomic writer does: the new set in a fresh directory, the
// ..data symlink swapped to it by a rename, each file a symlink through
// ..data. A file of the same name that is not such a link (an earlier
// plain write) is replaced by one.
func writeVolume(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("istiolab: %w", err)
	}
	ts, err := os.MkdirTemp(dir, "..data-")
	if err != nil {
		return fmt.Errorf("istiolab: %w", err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(ts, name), b, 0o600); err != nil {
			return fmt.Errorf("istiolab: %w", err)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return fmt.Errorf("istiolab: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return fmt.Errorf("istiolab: %w", err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join("..data", name) {
			continue
		}
		// Renamed over the old file: no moment without one.
		if err := os.Symlink(filepath.Join("..data", name), link+".tmp"); err != nil {
			return fmt.Errorf("istiolab: %w", err)
		}
		if err := os.Rename(link+".tmp", link); err != nil {
			return fmt.Errorf("istiolab: %w", err)
		}
	}
	if old != "" && old != filepath.Base(ts) {
		_ = os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}
