package labrun

import (
	"context"
	"errors"
	"fmt"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/state"
)

// ClusterOptions describe a lab cluster beyond its config file.
type ClusterOptions struct {
	// Binary is the ztunnel executable to run in meshed pods.
	Binary string
	// Dir receives the CA files and the config; it must exist.
	Dir string
	// ExtraPods adds pods that are in no config (unknown destinations):
	// node name -> pod names, created after the configured ones.
	ExtraPods map[string][]string
	// DaemonEnv adds environment variables to every daemon.
	DaemonEnv []string
	// LogLevel is every daemon's RUST_LOG.
	LogLevel string
	// Capture selects variants of the meshed pods' capture rules (such as
	// RedirectDNS, for the DNS proxy).
	Capture netnslab.CaptureOptions
	// NoFile runs every daemon with that RLIMIT_NOFILE (DaemonOptions).
	NoFile uint64
}

// Cluster is a lab built from a ztunnel local config: one pod per workload
// on the workload's node, with capture rules and a daemon in every HBONE
// workload's pod.
type Cluster struct {
	Lab         *netnslab.Lab
	CA          *caclient.BuiltinCA
	TrustDomain string
	ConfigPath  string
	Snapshot    *state.Snapshot
	Pods        map[string]*netnslab.Pod
	Daemons     map[string]*Daemon

	opts      ClusterOptions
	files     clusterFiles
	workloads map[string]*state.Workload // by name
}

// StartCluster builds the topology config describes inside lab and starts the
// daemons. The config's workload IPs must be the ones the lab assigns: pods
// are created in file order per node, node N's pods get 10.244.N.2, .3, ...
// A workload known by hostname only gets no pod.
func StartCluster(ctx context.Context, lab *netnslab.Lab, config []byte, o ClusterOptions) (*Cluster, error) {
	lc, snap, err := parseTopology(config)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		Lab: lab, Snapshot: snap, TrustDomain: identity.DefaultTrustDomain,
		Pods: map[string]*netnslab.Pod{}, Daemons: map[string]*Daemon{},
		opts: o, workloads: map[string]*state.Workload{},
	}
	if c.CA, err = caclient.NewBuiltinCA(c.TrustDomain); err != nil {
		return nil, err
	}
	if c.files, err = writeClusterFiles(o.Dir, c.CA, config); err != nil {
		return nil, err
	}
	c.ConfigPath = c.files.config

	pl := newPlacement(lab, map[string]*netnslab.Node{}, c.Pods)
	// Workloads in file order: the snapshot sorts, the raw config keeps order.
	for _, w := range lc.Workloads {
		if len(w.Addresses) == 0 && w.Hostname() != "" {
			continue // known by hostname only (on-demand DNS): no pod
		}
		if _, err := pl.workload(w); err != nil {
			return nil, err
		}
		c.workloads[w.Name] = w
	}
	if err := pl.extra(o.ExtraPods); err != nil {
		return nil, err
	}
	for _, w := range lc.Workloads {
		if w.Protocol != state.ProtocolHBONE || c.Pods[w.Name] == nil {
			continue
		}
		if _, err := c.Mesh(ctx, w.Name); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Mesh installs the capture rules in the pod of the config's workload
// called name and starts a daemon there, with the cluster's options, and
// waits for its readiness. StartCluster does it for every HBONE workload;
// a test calls it for a workload of another protocol, as a pod captured
// before its workload record says HBONE is served.
func (c *Cluster) Mesh(ctx context.Context, name string) (*Daemon, error) {
	p, w := c.Pods[name], c.workloads[name]
	if p == nil || w == nil {
		return nil, fmt.Errorf("labrun: no workload %q with a pod", name)
	}
	if err := p.InstallCaptureWith(c.opts.Capture); err != nil {
		return nil, err
	}
	env := c.opts.DaemonEnv
	if w.Network() != "" {
		// The daemon is on its workload's network (multi-network labs).
		env = append([]string{"NETWORK=" + w.Network()}, c.opts.DaemonEnv...)
	}
	d, err := StartDaemon(ctx, p, DaemonOptions{
		Binary: c.opts.Binary, ConfigPath: c.ConfigPath, CACert: c.files.caCert, CAKey: c.files.caKey,
		Workload: w.Namespace() + "/" + w.Name + "/" + w.Identity().ServiceAccount, Env: env, LogLevel: c.opts.LogLevel,
		NoFile: c.opts.NoFile,
	})
	if err != nil {
		return nil, err
	}
	c.Daemons[name] = d
	return d, nil
}

// Close stops every daemon (the lab itself belongs to the caller).
func (c *Cluster) Close() error {
	var errs []error
	for _, d := range c.Daemons {
		if err := d.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("daemon %s: %w", d.Pod.Name, err))
		}
	}
	return errors.Join(errs...)
}
