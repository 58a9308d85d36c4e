package dnsproxy

import (
	"net"
	"net/netip"
	"sync"

	"github.com/ztunnel-go/ztunnel/fdbudget"
)

// budget bounds the forwarded queries in flight: at most max in all and at
// most perClient from one client address. A forwarded query can hold its
// slot for the whole upstream timeout (a dead upstream holds every one that
// long), so without the per-client bound one client's flood, or ordinary
// traffic during an outage, would leave no slot for anyone else. Local
// answers never take a slot.
type budget struct {
	max, perClient int

	mu       sync.Mutex // guards the following fields
	total    int
	byClient map[netip.Addr]int // only clients with a slot: at most max entries
}

func newBudget(max, perClient int) *budget {
	return &budget{max: max, perClient: perClient, byClient: make(map[netip.Addr]int)}
}

// acquire takes a slot for a query from client and reports whether it
// could; it never waits, so a full budget costs the caller nothing.
func (b *budget) acquire(client netip.Addr) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.total >= b.max || b.byClient[client] >= b.perClient {
		return false
	}
	b.total++
	b.byClient[client]++
	return true
}

// release returns a slot taken by acquire for client.
func (b *budget) release(client netip.Addr) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total--
	if n := b.byClient[client] - 1; n > 0 {
		b.byClient[client] = n
	} else {
		delete(b.byClient, client)
	}
}

// clientAddr is the budget key of a peer: its IP, IPv4 unmapped. Ports
// do not count: a stub resolver picks a new one for every UDP query.
func clientAddr(a net.Addr) netip.Addr {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.UDPAddr:
		ap = a.AddrPort()
	case *net.TCPAddr:
		ap = a.AddrPort()
	}
	return ap.Addr().Unmap()
}

// takeForward takes what a forwarded query holds until it is answered: a
// slot of the forwarding budget and a descriptor of the daemon's (its
// upstream socket), both for client; it reports false when either refuses,
// counted in Dropped and in ztunnel_go_dns_requests_refused_total under
// transport ("udp": the query is dropped; "tcp": answered SERVFAIL).
func (s *Server) takeForward(client netip.Addr, transport string) bool {
	if !s.fwd.acquire(client) {
		s.refused(transport)
		return false
	}
	if !s.takeFDs(client, 1) {
		s.fwd.release(client)
		s.refused(transport)
		return false
	}
	return true
}

// refused counts a forwarded query refused for want of capacity.
func (s *Server) refused(transport string) {
	s.dropped.Add(1)
	s.cfg.Metrics.DNSRefused(transport)
}

// releaseForward gives back what takeForward took.
func (s *Server) releaseForward(client netip.Addr) {
	s.cfg.Budget.Release(client, 1)
	s.fwd.release(client)
}

// takeFDs takes n descriptors of the daemon's budget for client, or counts
// the refusal (ztunnel_go_fd_budget_refusals_total{listener="dns"}) and logs
// it, at most once per fdbudget interval.
func (s *Server) takeFDs(client netip.Addr, n int) bool {
	b := s.cfg.Budget
	r := b.Acquire(client, n)
	if r == fdbudget.OK {
		return true
	}
	s.cfg.Metrics.FDBudgetRefused("dns", r.String())
	if log, unlogged := b.LogRefusal(); log {
		s.log.Warn("descriptor budget refused a DNS client", "peer", client.String(), "reason", r.String(),
			"peer_held", b.Held(client), "used", b.Used(), "total", b.Total(), "unlogged_refusals", unlogged)
	}
	return false
}
