package proxy

import (
	"net/netip"

	"github.com/ztunnel-go/ztunnel/fdbudget"
)

// What a connection takes from the daemon's descriptor budget
// (Config.Budget), in descriptors, for its peer's source IP.
const (
	// budgetPair is an accepted connection relayed to a socket of its own:
	// the accepted socket and the upstream it makes the daemon open (15006:
	// the dial to the app; 15001 and 15080: the dial, or for an HBONE route
	// at most one new pooled connection, so the budget never counts less
	// than is open). The relay's end gives it back (conn.releaseBudget).
	budgetPair = 2
	// budgetHBONEConn is a 15008 connection's TLS socket, given back when
	// the connection ends; each of its streams takes budgetStream.
	budgetHBONEConn = 1
	// budgetStream is the app socket an inbound CONNECT stream dials.
	budgetStream = 1
)

// The listener label of istio_fd_budget_refusals_total, and what each
// listener's accepted connections take.
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
// the refusal (istio_fd_budget_refusals_total) and logs it, at most once
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
// its relay has ended (relayEnded): an accepted connection's budgetPair
// (acceptLoop) or an inbound stream's budgetStream (serveHBONE), both for
// the source IP they were taken for, c.src's.
func (c *conn) releaseBudget() {
	switch {
	case c.accepted:
		c.p.cfg.Budget.Release(c.src.Addr(), budgetPair)
	case c.listed:
		c.p.cfg.Budget.Release(c.src.Addr(), budgetStream)
	}
}
