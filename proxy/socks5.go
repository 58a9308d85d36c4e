package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
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
	dst, err := p.router.resolveSOCKS(ctx, t)
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
