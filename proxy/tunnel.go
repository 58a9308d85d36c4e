package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/state"
)

// tunnelHandshakeTimeout bounds each client TLS handshake of a tunnel (the
// one to the peer's 15008 and the inner one through a network gateway).
const tunnelHandshakeTimeout = 10 * time.Second

// tunnelKey names the HBONE connections a new stream may share, as
// ztunnel's WorkloadKey does (src_id, dst_id, dst, src): streams of one
// source identity and IP to one peer address that must prove one of the
// same identities. The pool is shared by the proxies of a node, so the
// source is part of the key. An inner tunnel through a network gateway
// (Config.PoolInnerHBONE) is keyed by the gateway's address and the
// service it is for instead of the source IP.
type tunnelKey struct {
	srcID  identity.Identity
	dstIDs []string       // the identities the peer may prove, in route order
	dst    netip.AddrPort // the peer's ip:15008, or the gateway's (inner)
	srcIP  netip.Addr     // the source workload's first address; outer only
	inner  string         // inner only: the key of the service the tunnel is for
}

// String is the hbone.Pool key: fields joined by "|" (an inner key starts
// with "inner").
func (k tunnelKey) String() string {
	if k.inner != "" {
		return strings.Join([]string{"inner", k.srcID.String(), strings.Join(k.dstIDs, ","), k.dst.String(), k.inner}, "|")
	}
	return strings.Join([]string{k.srcID.String(), strings.Join(k.dstIDs, ","), k.srcIP.String(), k.dst.String()}, "|")
}

// tunnel opens the HBONE stream of one outbound connection: from the app of
// workload src at client, along route. open dials (or reuses a pooled
// connection to) the route's peer on 15008: TLS 1.3 with the source's
// SPIFFE certificate, the peer verified against the route's identities,
// then CONNECT. openInner (double HBONE) runs open to the network gateway
// and inside that stream a second TLS session and CONNECT to the
// destination. Every error is marked with the response flags of the step
// that failed (withFlags).
type tunnel struct {
	p      *Proxy
	src    *state.Workload
	client netip.AddrPort
	route  *outboundRoute
	cert   *mtls.WorkloadCert // certificate's, fetched once
}

// newTunnel is the tunnel of an outbound connection of p from client, an
// app of workload src, along route.
func newTunnel(p *Proxy, src *state.Workload, client netip.AddrPort, route *outboundRoute) *tunnel {
	return &tunnel{p: p, src: src, client: client, route: route}
}

// certificate is the source workload's certificate, the one both TLS
// sessions of double HBONE present.
func (t *tunnel) certificate(ctx context.Context) (*mtls.WorkloadCert, error) {
	if t.cert != nil {
		return t.cert, nil
	}
	srcID := t.p.router.identityOf(t.src)
	cert, err := t.p.cfg.Certs.Get(ctx, srcID)
	if err != nil {
		return nil, withFlags(metrics.FlagIdentityError, fmt.Errorf("certificate for %s: %w", srcID, err))
	}
	t.cert = cert
	return cert, nil
}

// key is the pool key of the route's tunnel to its peer.
func (t *tunnel) key() tunnelKey {
	var srcIP netip.Addr
	if len(t.src.Addresses) > 0 {
		srcIP = t.src.Addresses[0]
	}
	return tunnelKey{srcID: t.p.router.identityOf(t.src), dstIDs: t.route.sans, dst: t.route.dst, srcIP: srcIP}
}

// open opens (or reuses) a tunnel to the route's peer and sends CONNECT
// for the route's authority.
func (t *tunnel) open(ctx context.Context) (*hbone.Stream, error) {
	p, r := t.p, t.route
	cert, err := t.certificate(ctx)
	if err != nil {
		return nil, err
	}
	dial := func(ctx context.Context) (net.Conn, error) {
		tc, err := p.dialer.Dial(ctx, netip.Addr{}, r.dst)
		if err != nil {
			return nil, withFlags(metrics.FlagNetworkPolicy, fmt.Errorf("connect to %s (maybe a NetworkPolicy is blocking HBONE port 15008): %w", r.dst, err))
		}
		// The pool may outlive this cert; the TLS config pins the one in force
		// when the connection was made, which is what rotation needs.
		// crypto/tls runs the handshake; then the records are
		// mtls/record's (loopconn.go).
		tlsConn := clientTLS(tc, p.cfg.TLS.ClientConfig(cert, r.sans, mtls.WithCRL(p.cfg.CRL)))
		if err := t.handshake(ctx, tlsConn, tc); err != nil {
			return nil, withFlags(metrics.FlagTLSFailure, fmt.Errorf("tls handshake with %s: %w", r.dst, err))
		}
		return tlsConn, nil
	}
	req := &hbone.Request{Authority: r.authority, Header: p.connectHeader(t.src, t.client, r.service)}
	s, err := p.cfg.Pool.Connect(ctx, t.key().String(), dial, req)
	if err != nil {
		return nil, connectFailed(err, "upstream refused CONNECT "+r.authority, "")
	}
	return s, nil
}

// openInner opens the outer tunnel to the network gateway (open) and,
// inside it, the inner TLS session and CONNECT to the destination. Without
// inner pooling (ztunnel's behaviour) every call makes a new inner
// connection that closes once the returned stream ends.
func (t *tunnel) openInner(ctx context.Context) (*hbone.Stream, error) {
	p, r, g := t.p, t.route, t.route.gateway
	cert, err := t.certificate(ctx)
	if err != nil {
		return nil, err
	}
	dial := func(ctx context.Context) (net.Conn, error) {
		outer, err := t.open(ctx)
		if err != nil {
			// The outer error says what failed (responseFlags).
			return nil, fmt.Errorf("network gateway %s: %w", r.dst, err)
		}
		// The outer stream is a net.Conn with deadlines; tls bounds its
		// close_notify with one, so closing cannot hang on a full window.
		tlsConn := tls.Client(outer, p.cfg.TLS.ClientConfig(cert, g.sans, mtls.WithCRL(p.cfg.CRL)))
		if err := t.handshake(ctx, tlsConn, outer); err != nil {
			return nil, withFlags(metrics.FlagTLSFailure, fmt.Errorf("inner tls handshake with %s through network gateway %s: %w", g.authority, r.dst, err))
		}
		if id, err := mtls.PeerIdentity(tlsConn.ConnectionState()); err == nil {
			g.peerID = id
		}
		return tlsConn, nil
	}
	// The inner request carries what any CONNECT does (Forwarded with the
	// service, baggage, traceparent), and our network (ztunnel's).
	hdr := p.connectHeader(t.src, t.client, r.service)
	hdr.Set(headerForwardedNetwork, p.cfg.Network)
	req := &hbone.Request{Authority: g.authority, Header: hdr}
	var s *hbone.Stream
	if g.pool {
		s, err = p.cfg.Pool.Connect(ctx, g.key.String(), dial, req)
	} else {
		var nc net.Conn
		if nc, err = dial(ctx); err == nil {
			s, err = hbone.ConnectOnce(ctx, nc, p.cfg.HBONE, req)
		}
	}
	if err != nil {
		return nil, connectFailed(err, "destination refused inner CONNECT "+g.authority, "inner tunnel to "+g.authority)
	}
	return s, nil
}

// handshake runs tlsConn's client TLS handshake within
// tunnelHandshakeTimeout. On failure it closes under (what tlsConn runs over:
// the socket, or the outer stream) and counts a peer the CRL revokes.
func (t *tunnel) handshake(ctx context.Context, tlsConn interface {
	HandshakeContext(context.Context) error
}, under net.Conn) error {
	hctx, cancel := context.WithTimeout(ctx, tunnelHandshakeTimeout)
	defer cancel()
	err := tlsConn.HandshakeContext(hctx)
	if err != nil {
		under.Close()
		if errors.Is(err, mtls.ErrRevoked) {
			t.p.cfg.Metrics.CRLRejected(metrics.ReporterSource)
		}
	}
	return err
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
