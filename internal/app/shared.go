package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/ztunnel-go/ztunnel/admin"
	"github.com/ztunnel-go/ztunnel/dnsproxy"
	"github.com/ztunnel-go/ztunnel/inpod"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/proxy"
)

// sharedDeps is what the in-pod mode needs from the rest of the daemon.
type sharedDeps struct {
	Log     *slog.Logger
	Ready   *admin.Readiness
	Metrics *metrics.Metrics
	// UDS is the CNI agent's socket (INPOD_UDS); "" means
	// inpod.DefaultUDS.
	UDS string
	// NewProxy builds, without starting it, the proxy of one pod: the
	// workload it serves and the control function that runs its socket
	// creation (listen and dial) inside the pod's network namespace. The
	// proxy's Socket options must carry PACKET_MARK, and ReusePort
	// INPOD_PORT_REUSE.
	NewProxy func(w proxy.WorkloadRef, control func(fn func() error) error) (*proxy.Proxy, error)
	// NewDNS, when set (ISTIO_META_DNS_CAPTURE), builds the pod's DNS proxy
	// with the same control function; it runs and stops with the proxy.
	NewDNS func(w proxy.WorkloadRef, control func(fn func() error) error) (*dnsproxy.Server, error)
	// Warm, when set, wraps each pod's proxy so that its identity's
	// certificate is kept warm while the pod is up.
	Warm func(p inpod.Proxy, namespace, serviceAccount string) inpod.Proxy
}

// startShared prepares the in-pod mode: the ZDS client and one proxy per
// pod. It checks that the process may enter network namespaces and mark
// sockets (ztunnel fails at start without them) and returns the manager
// unstarted: the caller starts it (it connects to the CNI agent in the
// background) once the state is synced.
//
// The returned manager's Done channel closes on a ZDS protocol error (Err
// returns it), on which the daemon must exit 1; Drain(ctx) drains every
// pod's proxy gracefully and Close closes them at once.
func startShared(ctx context.Context, cfg *Config, deps sharedDeps) (*inpod.Manager, error) {
	if deps.NewProxy == nil {
		return nil, errors.New("shared mode: no proxy constructor")
	}
	if cfg.PacketMark == 0 {
		return nil, fmt.Errorf("%w: PACKET_MARK=0: shared mode marks its sockets so the pods' capture rules let them through; unset it (default 1337)", ErrUnsupported)
	}
	if err := inpod.CheckPrivileges(cfg.PacketMark); err != nil {
		return nil, err
	}
	var ready func(string) func()
	if deps.Ready != nil {
		ready = deps.Ready.Register
	}
	m, err := inpod.New(inpod.Config{
		UDS: deps.UDS,
		NewProxy: func(pod inpod.Pod) (inpod.Proxy, error) {
			w := cfg.workloadRef(pod.Namespace, pod.Name, pod.ServiceAccount)
			p, err := deps.NewProxy(w, pod.Netns.Run)
			if err != nil {
				return nil, err
			}
			if p == nil { // not a nil *proxy.Proxy inside a non-nil interface
				return nil, errors.New("shared mode: no proxy built")
			}
			var served inpod.Proxy = p
			if deps.NewDNS != nil {
				dns, err := deps.NewDNS(w, pod.Netns.Run)
				if err != nil {
					return nil, err
				}
				served = &withDNS{proxy: p, dns: dns}
			}
			if deps.Warm != nil {
				served = deps.Warm(served, pod.Namespace, pod.ServiceAccount)
			}
			return served, nil
		},
		Ready:   ready,
		Metrics: deps.Metrics,
		Logger:  deps.Log,
		// With SO_REUSEPORT a new daemon takes over new connections; this
		// keeps the old one's queued connections from being reset when it
		// closes its listeners.
		MigrateRequests: cfg.PortReuse,
	})
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		m.Close()
		return nil, ctx.Err()
	}
	return m, nil
}

// workloadRef names a workload this daemon serves: looked up among the
// workloads of this node and cluster only (ztunnel's local_node).
func (c *Config) workloadRef(namespace, name, serviceAccount string) proxy.WorkloadRef {
	return proxy.WorkloadRef{
		Namespace: namespace, Name: name, ServiceAccount: serviceAccount,
		Node: c.NodeName, Cluster: c.ClusterID,
	}
}

// workloadStateDump is the /config_dump "workloadState" of the in-pod
// mode: every pod by uid, as ztunnel shows it.
func workloadStateDump(m *inpod.Manager) map[string]admin.WorkloadStateDump {
	if m == nil {
		return map[string]admin.WorkloadStateDump{}
	}
	st := m.WorkloadState()
	out := make(map[string]admin.WorkloadStateDump, len(st))
	for uid, s := range st {
		d := admin.WorkloadStateDump{
			Info:  map[string]string{"name": s.Info.Name, "namespace": s.Info.Namespace, "serviceAccount": s.Info.ServiceAccount},
			State: s.State,
		}
		if p, ok := s.Proxy.(interface{ Connections() []proxy.Connection }); ok {
			d.Connections = connectionsDump(p.Connections())
		}
		out[uid] = d
	}
	return out
}

// connectionsDump is a proxy's connections in ztunnel's dump shape.
func connectionsDump(conns []proxy.Connection) *admin.ConnectionsDump {
	d := &admin.ConnectionsDump{Inbound: []admin.InboundConnDump{}, Outbound: []admin.OutboundConnDump{}}
	for _, c := range conns {
		if c.Inbound {
			in := admin.InboundConnDump{Src: c.Src.String(), ActualDst: c.ActualDst.String(), Protocol: c.Protocol}
			if c.ForHost != "" {
				in.OriginalDst = &c.ForHost
			}
			d.Inbound = append(d.Inbound, in)
			continue
		}
		d.Outbound = append(d.Outbound, admin.OutboundConnDump{
			Src: c.Src.String(), OriginalDst: c.OriginalDst.String(), ActualDst: c.ActualDst.String(), Protocol: c.Protocol,
		})
	}
	return d
}
