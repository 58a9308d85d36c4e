package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/state"
)

// outboundRoute is the decision for one outbound connection.
type outboundRoute struct {
	hbone     bool
	dst       netip.AddrPort // TCP target, or the HBONE peer's ip:15008
	authority string         // HBONE :authority (ip:targetPort)
	sans      []string       // expected server identities
	workload  *state.Workload
	service   *state.Service
	gateway   *doubleHBONE // endpoint on another network: the inner tunnel (gateway.go)
}

// handleOutbound serves a connection captured on 15001: its destination is
// the one the app dialed (SO_ORIGINAL_DST).
func (p *Proxy) handleOutbound(c *net.TCPConn) bool {
	p.cfg.Metrics.SocketOpened(metrics.ReporterSource)
	cn := newConn(p, dirOutbound, addrPortOf(c.RemoteAddr()))
	origDst, err := engine.OriginalDst(c)
	if err != nil {
		p.abortOutbound(c, cn, err)
		return false
	}
	return p.proxyOutbound(c, cn, origDst)
}

// abortOutbound ends an outbound connection that never got a route.
func (p *Proxy) abortOutbound(c *net.TCPConn, cn *conn, err error) {
	cn.fail(err)
	engine.TCPEndpoint{TCPConn: c}.Abort()
	p.cfg.Metrics.SocketClosed(metrics.ReporterSource)
}

// proxyOutbound routes, connects and relays an outbound connection to
// origDst, the destination the app asked for (captured or named over
// SOCKS5). The caller counted the socket opened; it is counted closed here
// or, once handed to the engine, when the relay ends.
func (p *Proxy) proxyOutbound(c *net.TCPConn, cn *conn, origDst netip.AddrPort) (handedOff bool) {
	defer func() {
		if !handedOff {
			p.cfg.Metrics.SocketClosed(metrics.ReporterSource)
		}
	}()
	abort := func(err error) {
		cn.fail(err)
		engine.TCPEndpoint{TCPConn: c}.Abort()
	}
	cn.dst = origDst
	// A destination on an own port at a local address is this listener or
	// a sibling: a self call, refused before and after the workload (and
	// its addresses) is known (dialguard.go).
	local := addrPortOf(c.LocalAddr()).Addr()
	if p.isSelfTarget(origDst, nil, local) {
		abort(fmt.Errorf("self call to illegal port %d refused", origDst.Port()))
		return
	}
	ctx := p.ctx
	srcW, snap, err := p.router.localWorkload(ctx)
	if err != nil {
		abort(err)
		return
	}
	if p.isSelfTarget(origDst, srcW, local) {
		abort(fmt.Errorf("self call to illegal port %d refused", origDst.Port()))
		return
	}
	route, err := p.router.routeOutbound(ctx, snap, srcW, cn.src, origDst)
	if err != nil {
		abort(err)
		return
	}
	cn.srcWorkload = srcW
	cn.dstWorkload, cn.service = route.workload, route.service
	// From here dst is the address dialled, what ztunnel logs as dst.addr
	// (an endpoint's ip:15008, a waypoint, a gateway); the original
	// destination is kept when it differs, for the connections dump.
	if route.hbone || route.dst != origDst {
		e := cn.extOf()
		e.origDst, e.hboneAddr, e.double = origDst, route.authority, route.gateway != nil
	}
	cn.dst = route.dst
	var upstream engine.Endpoint
	if route.hbone {
		cn.mtls = true
		cn.srcIdentity = p.router.ownIdentity(srcW)
		t := newTunnel(p, srcW, cn.src, &route)
		var s *hbone.Stream
		if route.gateway != nil {
			// As ztunnel: a double HBONE connection is opened once the
			// destination answered, as its labels come from that answer.
			s, err = t.openInner(ctx)
		} else {
			cn.open()
			s, err = t.open(ctx)
		}
		if err != nil {
			cn.end(err)
			engine.TCPEndpoint{TCPConn: c}.Abort()
			return
		}
		if g := route.gateway; g != nil {
			cn.ext.hasBaggage = true
			cn.ext.baggage = strings.Join(s.ResponseHeader().Values("Baggage"), ",")
			cn.ext.peerID = &g.peerID
			cn.open()
		}
		upstream = streamEndpoint{s}
	} else {
		if p.isSelfTarget(route.dst, srcW, local) {
			cn.fail(fmt.Errorf("self call to %s refused", route.dst))
			engine.TCPEndpoint{TCPConn: c}.Abort()
			return
		}
		// TCP to TCP: the engine connects and relays (on the epoll backend
		// its event loop completes the connect; see engine.StartDial).
		// The socket it dials is the connection's second descriptor.
		if !p.admitBudget(listenerOutbound, cn.src.Addr(), budgetUpstream) { // budget.go
			engine.TCPEndpoint{TCPConn: c}.Abort()
			return
		}
		cn.open()
		cn.listAccepted(c)
		cn.relayDial(ctx, c, &p.dialer, route.dst)
		return true
	}
	// The engine's event loop owns the relay from here (for a stream, the
	// goroutine relay on backends without stream support).
	cn.listAccepted(c)
	cn.relay(engine.TCPEndpoint{TCPConn: c}, upstream)
	return true
}
