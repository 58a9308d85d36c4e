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
}

func (p *Proxy) handleOutbound(c *net.TCPConn) {
	log := newAccessLog("outbound")
	src := addrPortOf(c.RemoteAddr())
	log.add("src.addr", src.String())
	origDst, err := engine.OriginalDst(c)
	if err != nil {
		log.failed(p.log, err)
		engine.TCPEndpoint{TCPConn: c}.Abort()
		return
	}
	log.add("dst.addr", origDst.String())
	if origDst.Addr().IsLoopback() && p.isIllegalPort(origDst.Port()) {
		log.failed(p.log, fmt.Errorf("self call to illegal port %d refused", origDst.Port()))
		engine.TCPEndpoint{TCPConn: c}.Abort()
		return
	}
	ctx := p.ctx
	srcW, snap, err := p.localWorkload(ctx)
	if err != nil {
		log.failed(p.log, err)
		engine.TCPEndpoint{TCPConn: c}.Abort()
		return
	}
	log.add("src.workload", srcW.Name)
	log.add("src.namespace", srcW.Namespace)
	route, err := p.routeOutbound(snap, srcW, origDst)
	if err != nil {
		log.failed(p.log, err)
		engine.TCPEndpoint{TCPConn: c}.Abort()
		return
	}
	if route.workload != nil {
		log.add("dst.workload", route.workload.Name)
		log.add("dst.namespace", route.workload.Namespace)
		log.add("dst.identity", p.identityOf(route.workload).String())
	}
	if route.service != nil {
		log.add("dst.service", route.service.Hostname)
	}

	var upstream engine.Endpoint
	if route.hbone {
		log.add("dst.hbone_addr", route.authority)
		s, err := p.connectHBONE(ctx, srcW, src, route)
		if err != nil {
			log.failed(p.log, err)
			engine.TCPEndpoint{TCPConn: c}.Abort()
			return
		}
		upstream = streamEndpoint{s}
	} else {
		up, err := p.dialer.Dial(ctx, netip.Addr{}, route.dst)
		if err != nil {
			log.failed(p.log, fmt.Errorf("connect to %s: %w", route.dst, err))
			engine.TCPEndpoint{TCPConn: c}.Abort()
			return
		}
		upstream = engine.TCPEndpoint{TCPConn: up}
	}
	var counters engine.Counters
	res := engine.Relay(engine.TCPEndpoint{TCPConn: c}, upstream, &counters)
	log.complete(p.log, counters.AToB.Load(), counters.BToA.Load(), res.Err)
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
func (p *Proxy) connectHBONE(ctx context.Context, srcW *state.Workload, client netip.AddrPort, r outboundRoute) (*hbone.Stream, error) {
	srcID := p.identityOf(srcW)
	cert, err := p.cfg.Certs.Get(ctx, srcID)
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", srcID, err)
	}
	var srcIP netip.Addr
	if len(srcW.Addresses) > 0 {
		srcIP = srcW.Addresses[0]
	}
	key := strings.Join([]string{srcID.String(), strings.Join(r.sans, ","), srcIP.String(), r.dst.String()}, "|")
	dial := func(ctx context.Context) (net.Conn, error) {
		tc, err := p.dialer.Dial(ctx, netip.Addr{}, r.dst)
		if err != nil {
			return nil, fmt.Errorf("connect to %s (maybe a NetworkPolicy is blocking HBONE port 15008): %w", r.dst, err)
		}
		// The pool may outlive this cert; the TLS config pins the one in force
		// when the connection was made, which is what rotation needs.
		// NewBatchConn turns the writer's batch of TLS records into one syscall.
		conn := tls.Client(hbone.NewBatchConn(tc), mtls.ClientConfig(cert, r.sans))
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := conn.HandshakeContext(hctx); err != nil {
			tc.Close()
			return nil, fmt.Errorf("tls handshake with %s: %w", r.dst, err)
		}
		return conn, nil
	}
	hdr := http.Header{}
	hdr.Set("Forwarded", fmt.Sprintf("for=%q", client.String()))
	s, err := p.cfg.Pool.Connect(ctx, key, dial, &hbone.Request{Authority: r.authority, Header: hdr})
	if err != nil {
		var se *hbone.StatusError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("upstream refused CONNECT %s: %w", r.authority, err)
		}
		return nil, err
	}
	return s, nil
}
