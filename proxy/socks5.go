package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
	"github.com/ztunnel-go/ztunnel/state"
)

// socksHandshakeTimeout bounds the SOCKS5 handshake and the name lookup, so
// a client that connects and stalls cannot hold a goroutine.
const socksHandshakeTimeout = 10 * time.Second

// handleSOCKS5 serves the SOCKS5 listener (15080): the app names its
// destination in the handshake instead of having it captured; from there
// the connection takes the normal outbound path.
func (p *Proxy) handleSOCKS5(c *net.TCPConn) bool {
	p.cfg.Metrics.SocketOpened(metrics.ReporterSource)
	cn := newConn(p, dirOutbound, addrPortOf(c.RemoteAddr()))
	_ = c.SetDeadline(time.Now().Add(socksHandshakeTimeout))
	t, err := socks5.Handshake(c)
	if err != nil {
		p.abortOutbound(c, cn, err)
		return false
	}
	ctx, cancel := context.WithTimeout(p.ctx, socksHandshakeTimeout)
	dst, err := p.resolveSOCKS(ctx, t)
	cancel()
	if err != nil {
		// The client learns why; the error is logged as the connection's.
		_ = socks5.WriteReply(c, socks5.ReplyHostUnreachable, netip.AddrPort{})
		p.abortOutbound(c, cn, fmt.Errorf("socks5: %w", err))
		return false
	}
	// As ztunnel: success is answered before the upstream is connected; a
	// later failure resets the connection.
	if err := socks5.WriteReply(c, socks5.ReplySucceeded, netip.AddrPort{}); err != nil {
		p.abortOutbound(c, cn, err)
		return false
	}
	_ = c.SetDeadline(time.Time{})
	return p.proxyOutbound(c, cn, dst)
}

// resolveSOCKS turns a SOCKS5 target into an address. A service hostname
// resolves to the service's VIP on our network (what the DNS proxy would
// answer); any other name goes to the resolver.
func (p *Proxy) resolveSOCKS(ctx context.Context, t socks5.Target) (netip.AddrPort, error) {
	if !t.IsDomain() {
		return t.Addr, nil
	}
	snap := p.cfg.State.Load()
	clientNS := p.cfg.Workload.Namespace
	if ip, ok := serviceVIP(snap, p.cfg.Network, t.Host, clientNS); ok {
		return netip.AddrPortFrom(ip, t.Port), nil
	}
	ips, err := p.cfg.Resolver.LookupNetIP(ctx, "ip", t.Host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("resolve %s: %w", t.Host, err)
	}
	// Prefer IPv4, as most pods have it; else the first answer.
	best := ips[0]
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			best = ip
			break
		}
	}
	return netip.AddrPortFrom(best.Unmap(), t.Port), nil
}

// serviceVIP finds the VIP of the service named host that a client in
// clientNS may use: one in the client's namespace first, then the first
// visible one by key; an IPv4 VIP on network first, then an IPv6 one.
func serviceVIP(snap *state.Snapshot, network, host, clientNS string) (netip.Addr, bool) {
	var chosen *state.Service
	for _, svc := range snap.ServicesByHostname(host) {
		if !svc.VisibleTo(clientNS) {
			continue
		}
		if chosen == nil || (svc.Namespace == clientNS && chosen.Namespace != clientNS) {
			chosen = svc
		}
	}
	if chosen == nil {
		return netip.Addr{}, false
	}
	var v6 netip.Addr
	for _, vip := range chosen.VIPs {
		if vip.Network != network {
			continue
		}
		if vip.Addr.Is4() {
			return vip.Addr, true
		}
		if !v6.IsValid() {
			v6 = vip.Addr
		}
	}
	return v6, v6.IsValid()
}
