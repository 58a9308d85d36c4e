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
	}
	if c.CA, err = caclient.NewBuiltinCA(c.TrustDomain); err != nil {
		return nil, err
	}
	files, err := writeClusterFiles(o.Dir, c.CA, config)
	if err != nil {
		return nil, err
	}
	c.ConfigPath = files.config

	pl := newPlacement(lab, map[string]*netnslab.Node{}, c.Pods)
	// Workloads in file order: the snapshot sorts, the raw config keeps order.
	for _, w := range lc.Workloads {
		if len(w.Addresses) == 0 && w.Hostname != "" {
			continue // known by hostname only (on-demand DNS): no pod
		}
		if _, err := pl.workload(w); err != nil {
			return nil, err
		}
	}
	if err := pl.extra(o.ExtraPods); err != nil {
		return nil, err
	}
	for _, w := range lc.Workloads {
		p := c.Pods[w.Name]
		if w.Protocol != state.ProtocolHBONE || p == nil {
			continue
		}
		if err := p.InstallCaptureWith(o.Capture); err != nil {
			c.Close()
			return nil, err
		}
		id := w.Identity()
		env := o.DaemonEnv
		if w.Network != "" {
			// The daemon is on its workload's network (multi-network labs).
			env = append([]string{"NETWORK=" + w.Network}, o.DaemonEnv...)
		}
		d, err := StartDaemon(ctx, p, DaemonOptions{
			Binary: o.Binary, ConfigPath: c.ConfigPath, CACert: files.caCert, CAKey: files.caKey,
			Workload: w.Namespace + "/" + w.Name + "/" + id.ServiceAccount, Env: env, LogLevel: o.LogLevel,
		})
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Daemons[w.Name] = d
	}
	return c, nil
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
