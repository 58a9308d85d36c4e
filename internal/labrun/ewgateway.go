package labrun

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
)

// EWGatewayOptions configure a test east-west gateway.
type EWGatewayOptions struct {
	// Cert is the gateway's workload certificate; clients verify it.
	Cert *mtls.WorkloadCert
	// Routes maps outer CONNECT authorities ("svc-hostname:port") to the
	// destination's HBONE address (podIP:15008).
	Routes map[string]netip.AddrPort
	// Dial reaches a destination; nil uses a plain net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// EWGateway stands in for Istio's east-west gateway in double-HBONE tests:
// it terminates the outer HBONE tunnel (mTLS with the gateway identity's
// certificate, client certificates from the same trust domain required),
// maps the CONNECT authority to a destination from a static table, and
// splices the tunnel's bytes (the client's inner TLS session) to that
// destination unread. Unknown authorities are answered 404.
type EWGateway struct {
	hl   hboneListener // tracks upstream connections and splices too
	opts EWGatewayOptions

	conns   atomic.Int64 // outer TLS connections accepted
	tunnels atomic.Int64 // CONNECTs spliced (one per inner connection)
}

// ServeEWGateway serves the gateway on ln until Close.
func ServeEWGateway(ln net.Listener, o EWGatewayOptions) *EWGateway {
	if o.Dial == nil {
		var d net.Dialer
		o.Dial = d.DialContext
	}
	g := &EWGateway{opts: o}
	g.hl.start(ln, o.Cert, g.serve, func() { g.conns.Add(1) })
	return g
}

// StartEWGateway runs a gateway inside pod on port with a certificate for
// id issued by ca; destinations are dialed from the pod.
func StartEWGateway(ctx context.Context, pod *netnslab.Pod, port uint16, ca *caclient.BuiltinCA, id identity.Identity, routes map[string]netip.AddrPort) (*EWGateway, error) {
	cert, err := caclient.New(caclient.Config{Signer: ca}).Fetch(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("labrun: gateway certificate: %w", err)
	}
	ln, err := pod.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		return nil, fmt.Errorf("labrun: gateway in %s: %w", pod.Name, err)
	}
	return ServeEWGateway(ln, EWGatewayOptions{Cert: cert, Routes: routes, Dial: pod.Dial}), nil
}

// Addr returns the listener's address.
func (g *EWGateway) Addr() net.Addr { return g.hl.ln.Addr() }

// Conns returns how many outer connections the gateway accepted.
func (g *EWGateway) Conns() int64 { return g.conns.Load() }

// Tunnels returns how many CONNECTs the gateway spliced to a destination:
// one per inner connection.
func (g *EWGateway) Tunnels() int64 { return g.tunnels.Load() }

func (g *EWGateway) serve(ctx context.Context, req *hbone.ServerRequest) {
	dst, ok := g.opts.Routes[req.Authority]
	if !ok {
		_, _ = req.Respond(http.StatusNotFound, nil)
		return
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	up, err := g.opts.Dial(dctx, "tcp", dst.String())
	cancel()
	if err != nil {
		_, _ = req.Respond(http.StatusServiceUnavailable, nil)
		return
	}
	if !g.hl.track(up) {
		up.Close()
		_, _ = req.Respond(http.StatusServiceUnavailable, nil)
		return
	}
	s, err := req.Respond(http.StatusOK, nil)
	if err != nil {
		g.hl.untrack(up)
		up.Close()
		return
	}
	g.tunnels.Add(1)
	g.hl.wg.Go(func() { g.splice(s, up) })
}

// splice copies both ways, propagating half-closes, until both directions
// end; an error in either resets both.
func (g *EWGateway) splice(s *hbone.Stream, up net.Conn) {
	defer g.hl.untrack(up)
	defer up.Close()
	defer s.Close()
	errc := make(chan error, 2)
	go func() {
		_, err := io.Copy(up, s)
		if err == nil {
			err = up.(interface{ CloseWrite() error }).CloseWrite()
		}
		errc <- err
	}()
	go func() {
		_, err := io.Copy(s, up)
		if err == nil {
			err = s.CloseWrite()
		}
		errc <- err
	}()
	for range 2 {
		if err := <-errc; err != nil {
			_ = s.Reset(http2.ErrCodeCancel)
			if tc, ok := up.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			up.Close()
		}
	}
}

// Close stops the gateway, ends every tunnel and waits for its goroutines.
func (g *EWGateway) Close() error { return g.hl.close() }
