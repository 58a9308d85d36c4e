package proxy

import (
	"net/netip"

	"github.com/ztunnel-go/ztunnel/fdbudget"
)

// What a connection takes from the daemon's descriptor budget
// (Config.Budget), in descriptors, for its peer's source IP.
const (
	// budgetSocket is an accepted socket, taken at accept (acceptLoop):
	// every listener's connections take it, and a 15008 connection takes
	// nothing more (each of its streams takes budgetUpstream).
	budgetSocket = 1
	// budgetUpstream is a socket a connection makes the daemon dial: the
	// app on 15006 (taken at accept with the accepted socket, so a refused
	// flood costs nothing further), the destination of an outbound
	// passthrough (proxyOutbound), the app of an inbound CONNECT stream
	// (serveHBONE). An outbound connection carried over HBONE takes none:
	// its stream rides a pooled connection shared by up to 100 (a new
	// pooled connection per destination is the pool's, not counted).
	budgetUpstream = 1
)

// The listener label of ztunnel_go_fd_budget_refusals_total and the refusal
// log. A passthrough's refused dial counts as outbound, whether it came
// through 15001 or SOCKS5.
const (
	listenerOutbound     = "outbound"
	listenerInboundPlain = "inbound_plaintext"
	listenerInboundHBONE = "inbound_hbone"
	listenerSOCKS5       = "socks5"
	// listenerHBONEStream counts the CONNECT streams of 15008 refused
	// their app dial, apart from its connections.
	listenerHBONEStream = "inbound_hbone_stream"
)

// budgetUse is what one listener's accepted connections take from the
// budget, and the listener's name for the refusals' metric and log.
type budgetUse struct {
	listener string
	units    int
}

// admitBudget takes units of the descriptor budget for peer, or counts
// the refusal (ztunnel_go_fd_budget_refusals_total) and logs it, at most once
// per fdbudget interval across the daemon, so that a flood does not flood
// the log too.
func (p *Proxy) admitBudget(listener string, peer netip.Addr, units int) bool {
	b := p.cfg.Budget
	r := b.Acquire(peer, units)
	if r == fdbudget.OK {
		return true
	}
	p.cfg.Metrics.FDBudgetRefused(listener, r.String())
	if log, unlogged := b.LogRefusal(); log {
		p.log.Warn("descriptor budget refused a connection", "listener", listener, "peer", peer.String(),
			"reason", r.String(), "peer_held", b.Held(peer), "used", b.Used(), "total", b.Total(),
			"unlogged_refusals", unlogged)
	}
	return false
}

// releaseBudget gives back what the connection took from the budget, once
// its relay has ended (relayEnded), for the source IP it was taken for,
// c.src's: an accepted connection its socket, and its upstream socket
// unless the upstream is an HBONE stream (c.mtls: the only accepted
// connections with it are outbound ones over HBONE); an inbound stream
// (listed) the app socket it dialled.
func (c *conn) releaseBudget() {
	switch {
	case c.accepted && c.mtls:
		c.p.cfg.Budget.Release(c.src.Addr(), budgetSocket)
	case c.accepted:
		c.p.cfg.Budget.Release(c.src.Addr(), budgetSocket+budgetUpstream)
	case c.listed:
		c.p.cfg.Budget.Release(c.src.Addr(), budgetUpstream)
	}
}
