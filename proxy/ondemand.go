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
func (rt *router) fetchAddress(ctx context.Context, snap *state.Snapshot, addr netip.Addr, has func(*state.Snapshot) bool) *state.Snapshot {
	if rt.onDemand == nil || has(snap) {
		return snap
	}
	name := rt.network + "/" + addr.Unmap().String()
	wait := rt.onDemandWait
	if wait <= 0 {
		wait = DefaultOnDemandWait
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	rt.log.Debug("sending demand request", "key", name, "scope", "xds")
	if err := rt.onDemand(ctx, name); err != nil {
		rt.log.Warn("on-demand lookup failed", "key", name, "error", err, "scope", "xds")
	}
	return rt.state.Load()
}

// fetchDestination makes sure an outbound destination (a service VIP or a
// workload IP on this network) is in the snapshot if the control plane
// knows it, as ztunnel's build_request does before routing.
func (rt *router) fetchDestination(ctx context.Context, snap *state.Snapshot, src *state.Workload, dst netip.Addr) *state.Snapshot {
	return rt.fetchAddress(ctx, snap, dst, func(s *state.Snapshot) bool {
		return s.ResolveVIPPreferring(rt.network, dst, src.Namespace(), rt.preferredNS) != nil ||
			s.WorkloadByAddr(rt.network, dst) != nil
	})
}

// fetchWorkloadByAddr is ztunnel's fetch_workload_by_address, for an
// inbound connection's source.
func (rt *router) fetchWorkloadByAddr(ctx context.Context, snap *state.Snapshot, addr netip.Addr) *state.Workload {
	snap = rt.fetchAddress(ctx, snap, addr, func(s *state.Snapshot) bool { return s.WorkloadByAddr(rt.network, addr) != nil })
	return snap.WorkloadByAddr(rt.network, addr)
}
