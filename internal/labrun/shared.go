package labrun

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/inpod/zdstest"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/state"
)

// SharedOptions describe a shared-mode lab cluster beyond its config file.
type SharedOptions struct {
	// Binary is the ztunnel executable, run once per node.
	Binary string
	// Dir receives the CA files, the config and the CNI agents' sockets; it
	// must exist.
	Dir string
	// Later names HBONE workloads of the config whose pods exist from the
	// start (so the lab numbers them as the config says) but are not in the
	// mesh until AddToMesh: no capture rules, not handed to the daemon.
	Later []string
	// ExtraPods adds pods that are in no config: node name -> pod names.
	ExtraPods map[string][]string
	// DaemonEnv adds environment variables to every daemon.
	DaemonEnv []string
	// LogLevel is every daemon's RUST_LOG.
	LogLevel string
	// Capture selects variants of the meshed pods' capture rules (such as
	// RedirectDNS, for the DNS proxy).
	Capture netnslab.CaptureOptions
	// NoWait starts the daemons without waiting for their readiness (for
	// daemons whose control plane is not there yet).
	NoWait bool
	// ReadOnlyProcSys runs every daemon with /proc/sys read-only, as the
	// chart's non-privileged container has it.
	ReadOnlyProcSys bool
	// CA is the built-in CA every daemon signs with (BUILTIN_CA_CERT and
	// _KEY); nil makes a fresh one for cluster.local.
	CA *caclient.BuiltinCA
	// NoFile runs every daemon with that RLIMIT_NOFILE (DaemonOptions).
	NoFile uint64
}

// DaemonStart adjusts one StartDaemonWith call.
type DaemonStart struct {
	// Env adds variables after SharedOptions.DaemonEnv (so it wins).
	Env []string
	// NoWait returns without waiting for the daemon's readiness.
	NoWait bool
}

// SharedCluster is a lab in Istio's default layout: one daemon per node in
// shared mode (PROXY_MODE=shared), each in a ztunnel pod of its own, fed by
// a fake CNI agent (zdstest) per node that installs the in-pod capture rules
// and hands the daemon each meshed pod's netns. Its methods are not safe for
// concurrent use.
type SharedCluster struct {
	Lab         *netnslab.Lab
	CA          *caclient.BuiltinCA
	TrustDomain string
	ConfigPath  string
	Snapshot    *state.Snapshot
	// Pods holds the workloads' and extra pods by name (a daemon's own
	// ztunnel pod is its Daemon.Pod).
	Pods map[string]*netnslab.Pod
	// Agents is each node's fake CNI agent.
	Agents map[string]*zdstest.Server
	// Daemons is each node's current daemon (the newest after an upgrade).
	Daemons map[string]*Daemon

	opts         SharedOptions
	files        clusterFiles
	nodes        map[string]*netnslab.Node
	workloads    map[string]*state.Workload // by name
	all          []*Daemon                  // every daemon started, in order
	ztPods       map[string]int             // ztunnel pods made per node
	stopped      map[*Daemon]bool           // by StopDaemon
	agentStopped map[string]bool            // by StopAgent, per node
}

// StartSharedCluster builds the topology config describes inside lab (as
// StartCluster does), meshes every HBONE workload not in o.Later, and
// starts one shared-mode daemon per node, waiting until each is ready (its
// first snapshot processed, no pod pending).
func StartSharedCluster(ctx context.Context, lab *netnslab.Lab, config []byte, o SharedOptions) (*SharedCluster, error) {
	lc, snap, err := parseTopology(config)
	if err != nil {
		return nil, err
	}
	c := &SharedCluster{
		Lab: lab, Snapshot: snap, TrustDomain: identity.DefaultTrustDomain,
		Pods: map[string]*netnslab.Pod{}, Agents: map[string]*zdstest.Server{}, Daemons: map[string]*Daemon{},
		opts: o, nodes: map[string]*netnslab.Node{}, workloads: map[string]*state.Workload{},
		ztPods: map[string]int{}, stopped: map[*Daemon]bool{}, agentStopped: map[string]bool{},
	}
	if c.CA = o.CA; c.CA == nil {
		if c.CA, err = caclient.NewBuiltinCA(c.TrustDomain); err != nil {
			return nil, err
		}
	}
	if c.files, err = writeClusterFiles(o.Dir, c.CA, config); err != nil {
		return nil, err
	}
	c.ConfigPath = c.files.config
	pl := newPlacement(lab, c.nodes, c.Pods)
	for _, w := range lc.Workloads {
		if _, err := pl.workload(w); err != nil {
			return nil, err
		}
		c.workloads[w.Name] = w
	}
	for _, name := range o.Later {
		if w, ok := c.workloads[name]; !ok || w.Protocol != state.ProtocolHBONE {
			return nil, fmt.Errorf("labrun: Later names %q, which is no HBONE workload of the config", name)
		}
	}
	if err := pl.extra(o.ExtraPods); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(c.nodes))
	for name := range c.nodes {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		agent, err := zdstest.Start(zdstest.Config{Path: filepath.Join(o.Dir, "zds-"+name+".sock")})
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Agents[name] = agent
	}
	// The agent knows the meshed pods before the daemon connects, so they
	// arrive in its first snapshot and readiness covers them.
	for _, w := range lc.Workloads {
		if w.Protocol != state.ProtocolHBONE || slices.Contains(o.Later, w.Name) {
			continue
		}
		if err := c.mesh(w.Name); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, name := range names {
		if _, err := c.StartDaemon(ctx, name); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// UID is the ZDS uid the lab gives a workload's pod: its config uid.
func (c *SharedCluster) UID(name string) string {
	if w, ok := c.workloads[name]; ok {
		return w.UID
	}
	return name
}

// mesh installs the pod's capture rules and tells its node's agent, which
// sends the Add if a daemon is connected.
func (c *SharedCluster) mesh(name string) error {
	p, w := c.Pods[name], c.workloads[name]
	if p == nil || w == nil {
		return fmt.Errorf("labrun: no workload %q", name)
	}
	if c.agentStopped[p.Node.Name] {
		return fmt.Errorf("labrun: the CNI agent of node %s is stopped", p.Node.Name)
	}
	if err := p.InstallCaptureWith(c.opts.Capture); err != nil {
		return err
	}
	ack, err := c.Agents[p.Node.Name].Add(zdstest.Pod{
		UID: w.UID, Name: w.Name, Namespace: w.Namespace(), ServiceAccount: w.Identity().ServiceAccount, NetnsPath: p.Path(),
	})
	if err != nil && !errors.Is(err, zdstest.ErrNotConnected) {
		return err
	}
	if ack != "" {
		return fmt.Errorf("labrun: daemon refused pod %s: %s", name, ack)
	}
	return nil
}

// AddToMesh meshes a Later pod while the cluster runs, as istio-cni does
// for a new ambient pod: capture rules, then Add to the node's daemon,
// which answers once the pod's proxy is listening.
func (c *SharedCluster) AddToMesh(name string) error { return c.mesh(name) }

// RemoveFromMesh takes a running pod out of the mesh: its daemon is told to
// drop it (Del), so its proxy closes at once, and its capture rules go, so
// its traffic flows straight to and from its apps again. istio-cni removes
// the rules before the Del, but once the lab's rules are gone (iptables-nft)
// the kernel no longer translates the proxy's close of a redirected
// connection back to the app's socket, which then hangs; with the Del first
// the app sees its connections close, as ztunnel's Del means. The pod's
// namespace stays. A pod whose namespace is gone (Pod.Delete) has no rules
// left to remove.
func (c *SharedCluster) RemoveFromMesh(name string) error {
	p := c.Pods[name]
	if p == nil {
		return fmt.Errorf("labrun: no pod %q", name)
	}
	if c.agentStopped[p.Node.Name] {
		return p.RemoveCapture()
	}
	ack, err := c.Agents[p.Node.Name].Del(c.UID(name))
	if err != nil && !errors.Is(err, zdstest.ErrNotConnected) {
		return err
	}
	if ack != "" {
		return fmt.Errorf("labrun: daemon refused to delete pod %s: %s", name, ack)
	}
	return p.RemoveCapture()
}

// StopAgent stops node's CNI agent for good, as removing istio-cni from the
// node does: its socket goes, the daemon's stream ends and it finds no agent
// to reconnect to; the pods it meshed stay captured and served. The cluster
// can no longer mesh pods on that node (AddToMesh fails; RemoveFromMesh only
// removes capture rules), and Close does not close the agent again.
func (c *SharedCluster) StopAgent(node string) error {
	a, ok := c.Agents[node]
	if !ok {
		return fmt.Errorf("labrun: no agent on node %q", node)
	}
	if c.agentStopped[node] {
		return nil
	}
	c.agentStopped[node] = true
	return a.Close()
}

// StartDaemon starts a daemon for node in a new ztunnel pod on that node
// (the first one at cluster start, a second one for an upgrade), connected
// to the node's agent, and waits until it is ready. It becomes
// Daemons[node].
func (c *SharedCluster) StartDaemon(ctx context.Context, node string) (*Daemon, error) {
	return c.StartDaemonWith(ctx, node, DaemonStart{NoWait: c.opts.NoWait})
}

// StartDaemonWith is StartDaemon with extra variables and, with NoWait,
// without waiting for readiness.
func (c *SharedCluster) StartDaemonWith(ctx context.Context, node string, o DaemonStart) (*Daemon, error) {
	n, ok := c.nodes[node]
	if !ok {
		return nil, fmt.Errorf("labrun: no node %q", node)
	}
	c.ztPods[node]++
	podName := fmt.Sprintf("ztunnel-%s-%d", node, c.ztPods[node])
	zt, err := n.AddPod(podName)
	if err != nil {
		return nil, err
	}
	env := append([]string{
		"PROXY_MODE=shared",
		"PROXY_WORKLOAD_INFO=",
		"INPOD_UDS=" + c.Agents[node].Path(),
		"NODE_NAME=" + node,
		"POD_NAME=" + podName,
		"POD_NAMESPACE=istio-system",
	}, c.opts.DaemonEnv...)
	env = append(env, o.Env...)
	d, err := StartDaemon(ctx, zt, DaemonOptions{
		Binary: c.opts.Binary, ConfigPath: c.ConfigPath, CACert: c.files.caCert, CAKey: c.files.caKey,
		Env: env, LogLevel: c.opts.LogLevel, NoWait: o.NoWait, ReadOnlyProcSys: c.opts.ReadOnlyProcSys,
		NoFile: c.opts.NoFile,
	})
	if err != nil {
		return nil, err
	}
	c.all = append(c.all, d)
	c.Daemons[node] = d
	return d, nil
}

// StopDaemon stops d (SIGTERM, graceful drain) and returns its exit error.
func (c *SharedCluster) StopDaemon(d *Daemon) error {
	c.stopped[d] = true
	return d.Stop()
}

// Close stops every daemon still running and the agents (the lab itself
// belongs to the caller).
func (c *SharedCluster) Close() error {
	var errs []error
	for _, d := range c.all {
		if c.stopped[d] {
			continue
		}
		if err := d.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("daemon %s: %w", d.Pod.Name, err))
		}
	}
	for node, a := range c.Agents {
		if !c.agentStopped[node] {
			errs = append(errs, a.Close())
		}
	}
	return errors.Join(errs...)
}

// AllDaemons returns every daemon the cluster started, in start order.
func (c *SharedCluster) AllDaemons() []*Daemon { return slices.Clone(c.all) }

// PID is the daemon's process id (`ip netns exec` execs the daemon in
// place), for reading its /proc figures.
func (d *Daemon) PID() int { return d.cmd.Process.Pid }
