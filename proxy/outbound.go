package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
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

func (p *Proxy) handleOutbound(c *net.TCPConn) (handedOff bool) {
	p.cfg.Metrics.SocketOpened(metrics.ReporterSource)
	defer func() {
		if !handedOff {
			p.cfg.Metrics.SocketClosed(metrics.ReporterSource)
		}
	}()
	ci := newConnInfo(dirOutbound, addrPortOf(c.RemoteAddr()))
	abort := func(err error) {
		p.failed(ci, err)
		engine.TCPEndpoint{TCPConn: c}.Abort()
	}
	origDst, err := engine.OriginalDst(c)
	if err != nil {
		abort(err)
		return
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
	route, err := p.routeOutbound(snap, srcW, origDst)
	if err != nil {
		abort(err)
		return
	}
	ci.srcWorkload = srcW
	ci.dstWorkload, ci.service = route.workload, route.service
	if route.workload != nil {
		ci.dstIdentity = p.identityOf(route.workload)
	}
	var upstream engine.Endpoint
	if route.hbone {
		ci.mtls = true
		ci.srcIdentity = p.identityOf(srcW)
		ci.hboneAddr = route.authority
		p.open(ci)
		connect := p.connectHBONE
		if route.gateway != nil {
			connect = p.connectDoubleHBONE
		}
		s, flags, err := connect(ctx, srcW, ci.src, route)
		if err != nil {
			p.complete(ci, flags, err)
			engine.TCPEndpoint{TCPConn: c}.Abort()
			return
		}
		upstream = streamEndpoint{s}
	} else {
		p.open(ci)
		up, err := p.dialer.Dial(ctx, netip.Addr{}, route.dst)
		if err != nil {
			p.complete(ci, metrics.FlagConnect, fmt.Errorf("connect to %s: %w", route.dst, err))
			engine.TCPEndpoint{TCPConn: c}.Abort()
			return
		}
		// TCP to TCP: the engine's event loop owns the relay from here.
		engine.Start(engine.TCPEndpoint{TCPConn: c}, engine.TCPEndpoint{TCPConn: up}, &ci.counters, func(res engine.Result) {
			p.complete(ci, metrics.FlagNone, relayErr(res))
			p.cfg.Metrics.SocketClosed(metrics.ReporterSource)
			p.release(c)
		})
		return true
	}
	res := engine.Relay(engine.TCPEndpoint{TCPConn: c}, upstream, &ci.counters)
	p.complete(ci, metrics.FlagNone, relayErr(res))
	return false
}

// routeOutbound decides where an outbound connection goes: a service VIP is
// load-balanced to an endpoint, a known workload IP goes to that workload by
// its tunnel protocol, anything else passes through as plain TCP.
func (p *Proxy) routeOutbound(snap *state.Snapshot, src *state.Workload, dst netip.AddrPort) (outboundRoute, error) {
	network := p.cfg.Network
	var (
		w       *state.Workload
		svc     *state.Service
		tgtPort = dst.Port()
	)
	if svc = snap.ResolveVIP(network, dst.Addr(), src.Namespace); svc != nil {
		ep, port, err := snap.PickEndpoint(src, svc, dst.Port(), rand.Uint64N)
		if err != nil {
			return outboundRoute{}, fmt.Errorf("service %s: %w", svc.Key(), err)
		}
		w, tgtPort = ep, port
	} else if w = snap.WorkloadByAddr(network, dst.Addr()); w == nil {
		// Unknown destination: passthrough, as ztunnel does.
		return outboundRoute{dst: dst}, nil
	}
	if w.Network != network && w.NetworkGateway != nil {
		return p.routeViaGateway(snap, src, w, svc, dst)
	}
	ip, ok := pickIP(w, dst.Addr())
	if !ok {
		return outboundRoute{}, fmt.Errorf("workload %s has no address", w.UID)
	}
	r := outboundRoute{workload: w, service: svc}
	if w.Protocol == state.ProtocolHBONE {
		r.hbone = true
		r.dst = netip.AddrPortFrom(ip, InboundHBONEPort)
		r.authority = netip.AddrPortFrom(ip, tgtPort).String()
		r.sans = append(r.sans, p.identityOf(w).String())
		if svc != nil {
			r.sans = append(r.sans, svc.SubjectAltNames...)
		}
		return r, nil
	}
	r.dst = netip.AddrPortFrom(ip, tgtPort)
	return r, nil
}

// pickIP prefers the address the client asked for when it belongs to the
// workload, else the first address of the same family, else the first.
func pickIP(w *state.Workload, want netip.Addr) (netip.Addr, bool) {
	if len(w.Addresses) == 0 {
		return netip.Addr{}, false
	}
	for _, a := range w.Addresses {
		if a == want {
			return a, true
		}
	}
	for _, a := range w.Addresses {
		if a.Is4() == want.Is4() {
			return a, true
		}
	}
	return w.Addresses[0], true
}

// connectHBONE opens (or reuses) a tunnel to the route's peer and sends CONNECT.
// The response flags say which step failed, for the metrics.
func (p *Proxy) connectHBONE(ctx context.Context, srcW *state.Workload, client netip.AddrPort, r outboundRoute) (*hbone.Stream, metrics.ResponseFlags, error) {
	srcID := p.identityOf(srcW)
	cert, err := p.cfg.Certs.Get(ctx, srcID)
	if err != nil {
		return nil, metrics.FlagIdentityError, fmt.Errorf("certificate for %s: %w", srcID, err)
	}
	var srcIP netip.Addr
	if len(srcW.Addresses) > 0 {
		srcIP = srcW.Addresses[0]
	}
	key := strings.Join([]string{srcID.String(), strings.Join(r.sans, ","), srcIP.String(), r.dst.String()}, "|")
	dial := func(ctx context.Context) (net.Conn, error) {
		tc, err := p.dialer.Dial(ctx, netip.Addr{}, r.dst)
		if err != nil {
			return nil, &dialError{metrics.FlagNetworkPolicy, fmt.Errorf("connect to %s (maybe a NetworkPolicy is blocking HBONE port 15008): %w", r.dst, err)}
		}
		// The pool may outlive this cert; the TLS config pins the one in force
		// when the connection was made, which is what rotation needs.
		// NewBatchConn turns the writer's batch of TLS records into one syscall.
		conn := tls.Client(hbone.NewBatchConn(tc), mtls.ClientConfig(cert, r.sans))
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := conn.HandshakeContext(hctx); err != nil {
			tc.Close()
			return nil, &dialError{metrics.FlagTLSFailure, fmt.Errorf("tls handshake with %s: %w", r.dst, err)}
		}
		return conn, nil
	}
	hdr := http.Header{}
	hdr.Set("Forwarded", fmt.Sprintf("for=%q", client.String()))
	s, err := p.cfg.Pool.Connect(ctx, key, dial, &hbone.Request{Authority: r.authority, Header: hdr})
	if err != nil {
		var se *hbone.StatusError
		var de *dialError
		switch {
		case errors.As(err, &se):
			flags := metrics.FlagConnect
			if se.Code == 401 {
				flags = metrics.FlagDeny
			}
			return nil, flags, fmt.Errorf("upstream refused CONNECT %s: %w", r.authority, err)
		case errors.As(err, &de):
			return nil, de.flags, err
		}
		return nil, metrics.FlagH2HandshakeFailure, err
	}
	return s, metrics.FlagNone, nil
}

// dialError marks which step of opening a tunnel connection failed.
type dialError struct {
	flags metrics.ResponseFlags
	err   error
}

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }
