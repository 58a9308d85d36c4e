package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/record"
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
	ci := newConnInfo(dirOutbound, addrPortOf(c.RemoteAddr()))
	origDst, err := engine.OriginalDst(c)
	if err != nil {
		p.abortOutbound(c, ci, err)
		return false
	}
	return p.proxyOutbound(c, ci, origDst)
}

// abortOutbound ends an outbound connection that never got a route.
func (p *Proxy) abortOutbound(c *net.TCPConn, ci *connInfo, err error) {
	p.failed(ci, err)
	engine.TCPEndpoint{TCPConn: c}.Abort()
	p.cfg.Metrics.SocketClosed(metrics.ReporterSource)
}

// proxyOutbound routes, connects and relays an outbound connection to
// origDst, the destination the app asked for (captured or named over
// SOCKS5). The caller counted the socket opened; it is counted closed here
// or, once handed to the engine, when the relay ends.
func (p *Proxy) proxyOutbound(c *net.TCPConn, ci *connInfo, origDst netip.AddrPort) (handedOff bool) {
	defer func() {
		if !handedOff {
			p.cfg.Metrics.SocketClosed(metrics.ReporterSource)
		}
	}()
	abort := func(err error) {
		p.failed(ci, err)
		engine.TCPEndpoint{TCPConn: c}.Abort()
	}
	ci.dst = origDst
	if origDst.Addr().IsLoopback() && p.isIllegalPort(origDst.Port()) {
		abort(fmt.Errorf("self call to illegal port %d refused", origDst.Port()))
		return
	}
	ctx := p.ctx
	srcW, snap, err := p.localWorkload(ctx)
	if err != nil {
		abort(err)
		return
	}
	route, err := p.routeOutbound(ctx, snap, srcW, ci.src, origDst)
	if err != nil {
		abort(err)
		return
	}
	ci.srcWorkload = srcW
	ci.dstWorkload, ci.service = route.workload, route.service
	// From here dst is the address dialled, what ztunnel logs as dst.addr
	// (an endpoint's ip:15008, a waypoint, a gateway); the original
	// destination is kept when it differs, for the connections dump.
	if route.hbone || route.dst != origDst {
		e := ci.extOf()
		e.origDst, e.hboneAddr, e.double = origDst, route.authority, route.gateway != nil
	}
	ci.dst = route.dst
	var upstream engine.Endpoint
	if route.hbone {
		ci.mtls = true
		ci.srcIdentity = p.ownIdentity(srcW)
		connect := p.connectHBONE
		if route.gateway != nil {
			// As ztunnel: a double HBONE connection is opened once the
			// destination answered, as its labels come from that answer.
			connect = p.connectDoubleHBONE
		} else {
			p.open(ci)
		}
		s, err := connect(ctx, srcW, ci.src, route)
		if err != nil {
			p.complete(ci, err)
			engine.TCPEndpoint{TCPConn: c}.Abort()
			return
		}
		if g := route.gateway; g != nil {
			ci.ext.hasBaggage = true
			ci.ext.baggage = strings.Join(s.ResponseHeader().Values("Baggage"), ",")
			ci.ext.peerID = &g.peerID
			p.open(ci)
		}
		upstream = streamEndpoint{s}
	} else {
		// TCP to TCP: the engine connects and relays (on the epoll backend
		// its event loop completes the connect; see engine.StartDial).
		p.open(ci)
		p.relayed(c, ci)
		p.startDial(ctx, ci, c, &p.dialer, route.dst)
		return true
	}
	// The engine's event loop owns the relay from here (for a stream, the
	// goroutine relay on backends without stream support).
	p.relayed(c, ci)
	p.startRelay(ci, engine.TCPEndpoint{TCPConn: c}, upstream)
	return true
}

// connectHBONE opens (or reuses) a tunnel to the route's peer and sends CONNECT.
// The error's response flags say which step failed, for the metrics.
func (p *Proxy) connectHBONE(ctx context.Context, srcW *state.Workload, client netip.AddrPort, r outboundRoute) (*hbone.Stream, error) {
	srcID := p.identityOf(srcW)
	cert, err := p.cfg.Certs.Get(ctx, srcID)
	if err != nil {
		return nil, withFlags(metrics.FlagIdentityError, fmt.Errorf("certificate for %s: %w", srcID, err))
	}
	var srcIP netip.Addr
	if len(srcW.Addresses) > 0 {
		srcIP = srcW.Addresses[0]
	}
	key := strings.Join([]string{srcID.String(), strings.Join(r.sans, ","), srcIP.String(), r.dst.String()}, "|")
	dial := func(ctx context.Context) (net.Conn, error) {
		tc, err := p.dialer.Dial(ctx, netip.Addr{}, r.dst)
		if err != nil {
			return nil, withFlags(metrics.FlagNetworkPolicy, fmt.Errorf("connect to %s (maybe a NetworkPolicy is blocking HBONE port 15008): %w", r.dst, err))
		}
		// The pool may outlive this cert; the TLS config pins the one in force
		// when the connection was made, which is what rotation needs.
		// crypto/tls runs the handshake; mtls/record then seals each batch of
		// HBONE frames into records in one buffer and one syscall.
		conn := record.Client(tc, p.cfg.TLS.ClientConfig(cert, r.sans, mtls.WithCRL(p.cfg.CRL)))
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := conn.HandshakeContext(hctx); err != nil {
			tc.Close()
			if errors.Is(err, mtls.ErrRevoked) {
				p.cfg.Metrics.CRLRejected(metrics.ReporterSource)
			}
			return nil, withFlags(metrics.FlagTLSFailure, fmt.Errorf("tls handshake with %s: %w", r.dst, err))
		}
		return conn, nil
	}
	hdr := p.connectHeader(srcW, client, r.service)
	s, err := p.cfg.Pool.Connect(ctx, key, dial, &hbone.Request{Authority: r.authority, Header: hdr})
	if err != nil {
		return nil, connectFailed(err, "upstream refused CONNECT "+r.authority, "")
	}
	return s, nil
}

// connectFailed is the error of a CONNECT through the pool that failed:
// refused by the peer (refused says what; responseFlags reads the status),
// a step of the dial that marked its error, or else the HTTP/2 handshake
// (other, when set, says with what).
func connectFailed(err error, refused, other string) error {
	if _, ok := errors.AsType[*hbone.StatusError](err); ok {
		return fmt.Errorf("%s: %w", refused, err)
	}
	if _, ok := errors.AsType[*flaggedError](err); ok {
		return err
	}
	if other != "" {
		err = fmt.Errorf("%s: %w", other, err)
	}
	return withFlags(metrics.FlagH2HandshakeFailure, err)
}
