package labrun

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
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
	ln   net.Listener
	srv  *hbone.Server
	cfg  *tls.Config
	opts EWGatewayOptions

	conns   atomic.Int64 // outer TLS connections accepted
	tunnels atomic.Int64 // CONNECTs spliced (one per inner connection)

	mu     sync.Mutex // guards open and closed
	open   map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup // accept loop, connections, splices
}

// ServeEWGateway serves the gateway on ln until Close.
func ServeEWGateway(ln net.Listener, o EWGatewayOptions) *EWGateway {
	if o.Dial == nil {
		var d net.Dialer
		o.Dial = d.DialContext
	}
	cert := o.Cert
	g := &EWGateway{ln: ln, opts: o, open: map[net.Conn]struct{}{},
		cfg: mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return cert, nil })}
	g.srv = hbone.NewServer(hbone.Config{}, g.serve)
	g.wg.Go(g.accept)
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
func (g *EWGateway) Addr() net.Addr { return g.ln.Addr() }

// Conns returns how many outer connections the gateway accepted.
func (g *EWGateway) Conns() int64 { return g.conns.Load() }

// Tunnels returns how many CONNECTs the gateway spliced to a destination:
// one per inner connection.
func (g *EWGateway) Tunnels() int64 { return g.tunnels.Load() }

func (g *EWGateway) accept() {
	for {
		nc, err := g.ln.Accept()
		if err != nil {
			return
		}
		if !g.track(nc) {
			nc.Close()
			return
		}
		g.wg.Go(func() {
			defer g.untrack(nc)
			tc := tls.Server(nc, g.cfg)
			hctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := tc.HandshakeContext(hctx)
			cancel()
			if err != nil {
				nc.Close()
				return
			}
			g.conns.Add(1)
			_ = g.srv.ServeConn(context.Background(), tc)
			tc.Close()
		})
	}
}

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
	if !g.track(up) {
		up.Close()
		_, _ = req.Respond(http.StatusServiceUnavailable, nil)
		return
	}
	s, err := req.Respond(http.StatusOK, nil)
	if err != nil {
		g.untrack(up)
		up.Close()
		return
	}
	g.tunnels.Add(1)
	g.wg.Go(func() { g.splice(s, up) })
}

// splice copies both ways, propagating half-closes, until both directions
// end; an error in either resets both.
func (g *EWGateway) splice(s *hbone.Stream, up net.Conn) {
	defer g.untrack(up)
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

func (g *EWGateway) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.open[c] = struct{}{}
	return true
}

func (g *EWGateway) untrack(c net.Conn) {
	g.mu.Lock()
	delete(g.open, c)
	g.mu.Unlock()
}

// Close stops the gateway, ends every tunnel and waits for its goroutines.
func (g *EWGateway) Close() error {
	err := g.ln.Close()
	g.mu.Lock()
	g.closed = true
	for c := range g.open {
		c.Close()
	}
	g.mu.Unlock()
	_ = g.srv.Close()
	g.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
