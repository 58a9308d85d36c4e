package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/state"
)

// router makes a proxy's routing decisions over the snapshot: which
// workload the proxy serves (localWorkload) and what identity each workload
// presents (identityOf); where an outbound connection goes (routeOutbound,
// route.go; through a network gateway, gateway.go); who an inbound one
// comes from (inboundSource, authority.go) and whether its tunnel may name
// its target (validateDestination); which address a SOCKS5 client's name
// means (resolveSOCKS, resolve.go); and, for what the snapshot lacks, the
// on-demand lookups (ondemand.go) and DNS (resolve.go). It opens no socket
// and keeps nothing per connection, so the handlers of *Proxy call it and
// its tests call it directly (newRouter), with neither a listener nor a
// proxy.
type router struct {
	network     string // Config.Network: this node's network
	preferredNS string // Config.PreferredServiceNamespace
	trustDomain string // Config.TrustDomain, for records that name none
	poolInner   bool   // Config.PoolInnerHBONE

	state     *state.Store
	self      WorkloadRef        // the served workload: its namespace, its name in errors
	info      state.WorkloadInfo // its snapshot lookup key
	localWait time.Duration      // Config.LocalWorkloadWait

	resolver     Resolver      // hostname-only workloads, SOCKS5 names
	onDemand     Demand        // nil: the snapshot is all there is
	onDemandWait time.Duration // zero: DefaultOnDemandWait
	metrics      *metrics.Metrics

	rnd    func(n uint64) uint64 // load-balancing randomness; nil = math/rand/v2
	log    *slog.Logger
	access *slog.Logger // log.With("scope", "access"), made once

	ownID atomic.Pointer[workloadIdentity] // ownIdentity's
}

// newRouter is the router of a proxy configured by cfg (defaults already
// set by New; tests pass what they exercise). Its loggers come from
// cfg.Logger, nil discarding.
func newRouter(cfg *Config) *router {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &router{
		network: cfg.Network, preferredNS: cfg.PreferredServiceNamespace, trustDomain: cfg.TrustDomain,
		poolInner: cfg.PoolInnerHBONE,
		state:     cfg.State, self: cfg.Workload, info: cfg.Workload.Info(), localWait: cfg.LocalWorkloadWait,
		resolver: cfg.Resolver, onDemand: cfg.OnDemand, onDemandWait: cfg.OnDemandWait, metrics: cfg.Metrics,
		log: log, access: log.With("scope", "access"),
	}
}

// localWorkload finds the workload this proxy serves, waiting up to
// LocalWorkloadWait for it to appear (ztunnel's 5s wait for xDS).
func (rt *router) localWorkload(ctx context.Context) (*state.Workload, *state.Snapshot, error) {
	// The common case, once per connection: the workload is known; no timer.
	snap := rt.state.Load()
	if w := snap.FindWorkload(rt.info); w != nil {
		return w, snap, nil
	}
	deadline := time.NewTimer(rt.localWait)
	defer deadline.Stop()
	for {
		changed := rt.state.Changed()
		snap := rt.state.Load()
		if w := snap.FindWorkload(rt.info); w != nil {
			return w, snap, nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil, nil, fmt.Errorf("failed to fetch information about local workload %s", rt.self)
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// ownIdentity is rt.identityOf(w) for w, the proxy's own workload, shared
// by the outbound connections made while w is current, which point at it
// rather than each holding a copy.
func (rt *router) ownIdentity(w *state.Workload) *identity.Identity {
	if c := rt.ownID.Load(); c != nil && c.w == w {
		return &c.id
	}
	c := &workloadIdentity{w: w, id: rt.identityOf(w)}
	rt.ownID.Store(c)
	return &c.id
}

// workloadIdentity is a workload and its identity (ownIdentity).
type workloadIdentity struct {
	w  *state.Workload
	id identity.Identity
}

// identityOf returns the identity workload w presents: its record's, in
// the proxy's trust domain when the record names none.
func (rt *router) identityOf(w *state.Workload) identity.Identity {
	id := w.Identity()
	if w.TrustDomain() == "" && rt.trustDomain != "" {
		id.TrustDomain = rt.trustDomain
	}
	return id
}
