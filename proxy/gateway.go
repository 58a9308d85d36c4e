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
	"strconv"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/state"
)

// Double HBONE (multi-network). An endpoint on another network is reached
// through its network's east-west gateway: an outer HBONE CONNECT to the
// gateway (pooled like any tunnel, verified against the gateway's
// identities) carries a second TLS session and CONNECT to the destination
// itself (verified against the destination's identities, with
// x-forwarded-network naming our network). Both authorities are
// "svc-hostname:port": the gateway routes by service, not by pod address,
// and the destination maps the service port to its target port.

// headerForwardedNetwork names the client's network on the inner CONNECT of
// double HBONE; the destination then knows the peer address is the gateway's.
const headerForwardedNetwork = "X-Forwarded-Network"

// doubleHBONE is the inner tunnel of a route through a network gateway; the
// route's own fields describe the outer tunnel to the gateway.
type doubleHBONE struct {
	authority string   // svc-hostname:port
	sans      []string // the destination's identities: workload identity + service SANs
	// pool lets inner connections carry many streams (Config.PoolInnerHBONE).
	pool bool
	// poolKey groups interchangeable inner connections.
	poolKey string
}

// routeViaGateway routes to w, an endpoint on another network with a
// network gateway, by double HBONE. It needs the service the client
// addressed: the gateway only understands service authorities.
func (p *Proxy) routeViaGateway(snap *state.Snapshot, src, w *state.Workload, svc *state.Service, dst netip.AddrPort) (outboundRoute, error) {
	if svc == nil {
		return outboundRoute{}, fmt.Errorf("workload %s is on network %q and reachable only through its network gateway, which needs a service address (svc-hostname:port); address a service of the workload instead", w.UID, w.Network)
	}
	gw, gwSANs, err := p.resolveGateway(snap, w.NetworkGateway, dst.Addr())
	if err != nil {
		return outboundRoute{}, fmt.Errorf("workload %s on network %q: %w", w.UID, w.Network, err)
	}
	authority := net.JoinHostPort(svc.Hostname, strconv.Itoa(int(dst.Port())))
	final := append([]string{p.identityOf(w).String()}, svc.SubjectAltNames...)
	inner := &doubleHBONE{
		authority: authority,
		sans:      final,
		// Only a ztunnel (or a waypoint) behind the gateway multiplexes
		// inner streams; see Config.PoolInnerHBONE.
		pool: p.cfg.PoolInnerHBONE && w.Protocol == state.ProtocolHBONE,
	}
	if inner.pool {
		inner.poolKey = strings.Join([]string{"inner", p.identityOf(src).String(), strings.Join(final, ","), gw.String(), svc.Key()}, "|")
	}
	return outboundRoute{
		hbone: true, dst: gw, authority: authority, sans: gwSANs,
		workload: w, service: svc, gateway: inner,
	}, nil
}

// resolveGateway finds where a network gateway listens and which identities
// it must present: a workload address is that workload; a service (by
// hostname, or by VIP) is one of its endpoints, which may present the
// endpoint's identity or one of the service's SANs. The port is the
// gateway's HBONE mTLS port (15008 when unset).
func (p *Proxy) resolveGateway(snap *state.Snapshot, g *state.GatewayAddress, want netip.Addr) (netip.AddrPort, []string, error) {
	port := g.HBONEMTLSPort
	if port == 0 {
		port = InboundHBONEPort
	}
	switch {
	case g.Address != nil:
		a := *g.Address
		if gw := snap.WorkloadByAddr(a.Network, a.Addr); gw != nil {
			return netip.AddrPortFrom(a.Addr.Unmap(), port), []string{p.identityOf(gw).String()}, nil
		}
		if gsvc := snap.ServiceByVIP(a.Network, a.Addr); gsvc != nil {
			return p.gatewayEndpoint(snap, gsvc, port, want)
		}
		return netip.AddrPort{}, nil, fmt.Errorf("network gateway %s is unknown (no workload or service has that address): %w", a, state.ErrUnknownGateway)
	case g.Hostname != nil:
		gsvc := snap.ServiceByKey(g.Hostname.String())
		if gsvc == nil {
			return netip.AddrPort{}, nil, fmt.Errorf("network gateway service %s is unknown: %w", g.Hostname, state.ErrUnknownGateway)
		}
		return p.gatewayEndpoint(snap, gsvc, port, want)
	}
	return netip.AddrPort{}, nil, errors.New("network gateway has no destination")
}

// gatewayEndpoint picks an endpoint of a gateway service, weighted by
// capacity, among those with an address.
func (p *Proxy) gatewayEndpoint(snap *state.Snapshot, gsvc *state.Service, port uint16, want netip.Addr) (netip.AddrPort, []string, error) {
	eps := snap.Endpoints(gsvc)
	var total uint64
	for _, ep := range eps {
		if len(ep.Workload.Addresses) > 0 {
			total += uint64(ep.Workload.Capacity)
		}
	}
	if total == 0 {
		return netip.AddrPort{}, nil, fmt.Errorf("network gateway service %s: %w", gsvc.Key(), state.ErrNoHealthyUpstream)
	}
	r := rand.Uint64N(total)
	for _, ep := range eps {
		w := ep.Workload
		if len(w.Addresses) == 0 {
			continue
		}
		if c := uint64(w.Capacity); r >= c {
			r -= c
			continue
		}
		ip, _ := state.SelectAddress(w, want, gsvc.IPFamilies)
		sans := append([]string{p.identityOf(w).String()}, gsvc.SubjectAltNames...)
		return netip.AddrPortFrom(ip.Unmap(), port), sans, nil
	}
	return netip.AddrPort{}, nil, fmt.Errorf("network gateway service %s: %w", gsvc.Key(), state.ErrNoHealthyUpstream)
}

// connectDoubleHBONE opens the outer tunnel to the gateway and, inside it,
// the inner TLS session and CONNECT to the destination. Without inner
// pooling (ztunnel's behaviour) every call makes a new inner connection
// that closes once the returned stream ends.
func (p *Proxy) connectDoubleHBONE(ctx context.Context, srcW *state.Workload, client netip.AddrPort, r outboundRoute) (*hbone.Stream, metrics.ResponseFlags, error) {
	g := r.gateway
	srcID := p.identityOf(srcW)
	cert, err := p.cfg.Certs.Get(ctx, srcID)
	if err != nil {
		return nil, metrics.FlagIdentityError, fmt.Errorf("certificate for %s: %w", srcID, err)
	}
	dial := func(ctx context.Context) (net.Conn, error) {
		outer, flags, err := p.connectHBONE(ctx, srcW, client, r)
		if err != nil {
			return nil, &dialError{flags, fmt.Errorf("network gateway %s: %w", r.dst, err)}
		}
		// The outer stream is a net.Conn with deadlines; tls bounds its
		// close_notify with one, so closing cannot hang on a full window.
		conn := tls.Client(outer, mtls.ClientConfig(cert, g.sans))
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := conn.HandshakeContext(hctx); err != nil {
			outer.Close()
			return nil, &dialError{metrics.FlagTLSFailure, fmt.Errorf("inner tls handshake with %s through network gateway %s: %w", g.authority, r.dst, err)}
		}
		return conn, nil
	}
	hdr := http.Header{}
	hdr.Set("Forwarded", fmt.Sprintf("for=%q", client.String()))
	hdr.Set(headerForwardedNetwork, p.cfg.Network)
	req := &hbone.Request{Authority: g.authority, Header: hdr}
	var s *hbone.Stream
	if g.pool {
		s, err = p.cfg.Pool.Connect(ctx, g.poolKey, dial, req)
	} else {
		var nc net.Conn
		if nc, err = dial(ctx); err == nil {
			s, err = hbone.ConnectOnce(ctx, nc, p.cfg.HBONE, req)
		}
	}
	if err != nil {
		var se *hbone.StatusError
		var de *dialError
		switch {
		case errors.As(err, &se):
			flags := metrics.FlagConnect
			if se.Code == http.StatusUnauthorized {
				flags = metrics.FlagDeny
			}
			return nil, flags, fmt.Errorf("destination refused inner CONNECT %s: %w", g.authority, err)
		case errors.As(err, &de):
			return nil, de.flags, err
		}
		return nil, metrics.FlagH2HandshakeFailure, fmt.Errorf("inner tunnel to %s: %w", g.authority, err)
	}
	return s, metrics.FlagNone, nil
}
