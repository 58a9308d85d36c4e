package proxy

import (
	"context"
	"net/netip"
	"time"

	"github.com/ztunnel-go/ztunnel/state"
)

// Demand asks the control plane for one Address resource on demand
// (XDS_ON_DEMAND) and returns once its answer (the resource, or word that it
// does not exist) has been applied to the store, or ctx ends. name is
// ztunnel's key for an address, "network/IP". xdsclient.Client.Lookup
// implements it.
type Demand func(ctx context.Context, name string) error

// DefaultOnDemandWait bounds how long a connection waits for an on-demand
// answer when Config.OnDemandWait is zero. ztunnel waits until the control
// plane answers, however long that takes; a bound keeps a control plane
// that never answers from holding connections (and their goroutines)
// forever, and what follows a timeout is what follows a miss.
const DefaultOnDemandWait = 5 * time.Second

// fetchAddress is ztunnel's fetch_address: when snap knows addr (has says
// whether it does), it is returned as is; otherwise, with on-demand lookups
// on, the control plane is asked for network/addr, and the snapshot
// published after its answer is returned. A miss (or a timeout, logged at
// warn) leaves the caller where a snapshot without addr leads: an unknown
// destination passes through, an unknown source has no workload.
func (p *Proxy) fetchAddress(ctx context.Context, snap *state.Snapshot, addr netip.Addr, has func(*state.Snapshot) bool) *state.Snapshot {
	if p.cfg.OnDemand == nil || has(snap) {
		return snap
	}
	name := p.cfg.Network + "/" + addr.Unmap().String()
	wait := p.cfg.OnDemandWait
	if wait <= 0 {
		wait = DefaultOnDemandWait
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	p.log.Debug("sending demand request", "key", name, "scope", "xds")
	if err := p.cfg.OnDemand(ctx, name); err != nil {
		p.log.Warn("on-demand lookup failed", "key", name, "error", err, "scope", "xds")
	}
	return p.cfg.State.Load()
}

// fetchDestination makes sure an outbound destination (a service VIP or a
// workload IP on this network) is in the snapshot if the control plane
// knows it, as ztunnel's build_request does before routing.
func (p *Proxy) fetchDestination(ctx context.Context, snap *state.Snapshot, src *state.Workload, dst netip.Addr) *state.Snapshot {
	return p.fetchAddress(ctx, snap, dst, func(s *state.Snapshot) bool {
		return s.ResolveVIPPreferring(p.cfg.Network, dst, src.Namespace, p.cfg.PreferredServiceNamespace) != nil ||
			s.WorkloadByAddr(p.cfg.Network, dst) != nil
	})
}

// fetchWorkloadByAddr is ztunnel's fetch_workload_by_address, for an
// inbound connection's source.
func (p *Proxy) fetchWorkloadByAddr(ctx context.Context, snap *state.Snapshot, addr netip.Addr) *state.Workload {
	snap = p.fetchAddress(ctx, snap, addr, func(s *state.Snapshot) bool { return s.WorkloadByAddr(p.cfg.Network, addr) != nil })
	return snap.WorkloadByAddr(p.cfg.Network, addr)
}

// fetchTunnelTarget is the on-demand lookup of ztunnel's
// validate_destination: a tunnel whose authority names an IP other than the
// one it arrived on is allowed when this workload is that target's waypoint
// (the "sandwich"), so when the snapshot knows nothing at that IP it is asked
// for before the check.
func (p *Proxy) fetchTunnelTarget(ctx context.Context, snap *state.Snapshot, local *state.Workload, target, conn netip.AddrPort) *state.Snapshot {
	if target.Addr() == conn.Addr() || local.ApplicationTunnel != nil {
		return snap
	}
	return p.fetchAddress(ctx, snap, target.Addr(), func(s *state.Snapshot) bool {
		w, svc := s.FindAddress(p.cfg.Network, target.Addr())
		return w != nil || svc != nil
	})
}
