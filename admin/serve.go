package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// The defaults of Limits. The timeouts follow ztunnel's servers
// (hyper_util.rs: header_read_timeout 2 s, max_buf_size 8 KiB); the caps are
// sized for the clients these servers have: a node's Prometheus scrapers
// (one keep-alive connection each), kubelet probes (one connection per
// probe, no keep-alive) and an operator's tools (istioctl, curl, pprof, a
// browser: a handful).
const (
	// DefaultHeaderTimeout is ztunnel's header_read_timeout: a request
	// head must arrive whole within it, on a new connection counted from
	// the accept.
	DefaultHeaderTimeout = 2 * time.Second
	// DefaultIdleTimeout bounds a keep-alive connection's wait for its
	// next request. hyper arms header_read_timeout again once a response
	// is written, so an idle ztunnel connection is closed 2 s after its
	// last response; Go splits that wait into IdleTimeout (until the
	// first byte) and ReadHeaderTimeout (the rest of the head).
	DefaultIdleTimeout = 2 * time.Second
	// DefaultReadTimeout bounds the reading of a whole request, its body
	// included (read by the handler, or discarded by the server after
	// it). No endpoint reads a body; hyper drops an unread one with the
	// connection, Go's server reads up to 256 KiB of it first.
	DefaultReadTimeout = 5 * time.Second
	// DefaultWriteTimeout bounds a write that makes no progress: a client
	// that stops reading is cut off, however long the response. 10 s is
	// Prometheus's default scrape timeout.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultMaxHeaderBytes is half of ztunnel's max_buf_size (8 KiB):
	// Go's server reads up to MaxHeaderBytes + 4 KiB of request head
	// before it answers 431, so the head is bounded at 8 KiB as in
	// ztunnel.
	DefaultMaxHeaderBytes = 4 << 10
	// DefaultMaxConnsPerPeer is what one source address may hold open:
	// about three times what an honest client uses (a scraper holds one,
	// kubelet one per probe at a time, a browser up to six).
	DefaultMaxConnsPerPeer = 8
	// DefaultMaxConns is the server's total: sixteen peers at their cap,
	// several times the distinct clients of a node's ztunnel.
	DefaultMaxConns = 128
)

// Limits bounds one server's connections. Zero fields take the Default*
// values.
type Limits struct {
	// HeaderTimeout is http.Server's ReadHeaderTimeout.
	HeaderTimeout time.Duration
	// IdleTimeout is http.Server's IdleTimeout.
	IdleTimeout time.Duration
	// ReadTimeout is http.Server's ReadTimeout: the whole request, from
	// its first byte (the server lifts it once the body is read, so it
	// does not bound a handler).
	ReadTimeout time.Duration
	// WriteTimeout bounds each write of up to writeChunk bytes to the
	// connection: a stall, not a response's duration, so a CPU profile of
	// 300 s or a large /config_dump is not cut while its client reads.
	WriteTimeout time.Duration
	// MaxHeaderBytes is http.Server's MaxHeaderBytes.
	MaxHeaderBytes int
	// MaxConnsPerPeer caps the connections one source address holds.
	MaxConnsPerPeer int
	// MaxConns caps the server's connections.
	MaxConns int
}

// withDefaults fills the zero fields.
func (l Limits) withDefaults() Limits {
	set := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	set(&l.HeaderTimeout, DefaultHeaderTimeout)
	set(&l.IdleTimeout, DefaultIdleTimeout)
	set(&l.ReadTimeout, DefaultReadTimeout)
	set(&l.WriteTimeout, DefaultWriteTimeout)
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxConnsPerPeer == 0 {
		l.MaxConnsPerPeer = DefaultMaxConnsPerPeer
	}
	if l.MaxConns == 0 {
		l.MaxConns = DefaultMaxConns
	}
	return l
}

// ServeConfig is one of the daemon's HTTP servers.
type ServeConfig struct {
	// Name labels the server in logs and refusals: "admin", "stats" or
	// "readiness".
	Name string
	// Addr is the address to listen on; "localhost:PORT" listens on both
	// loopbacks, as ztunnel's Address::Localhost (IPv4's only with
	// IPv4Only). A host that is an IPv4 address takes IPv4 connections
	// only (Go would listen dual-stack on 0.0.0.0).
	Addr string
	// IPv4Only is IPV6_ENABLED=false: localhost means 127.0.0.1 alone.
	IPv4Only bool
	// Handler serves the requests.
	Handler http.Handler
	// Logger receives the server's errors and refusals; nil discards.
	Logger *slog.Logger
	// Limits bounds the connections.
	Limits Limits
	// OnRefused is called for each connection refused at accept, with
	// the server's Name (the metrics package counts them; admin does not
	// import it); nil counts nothing.
	OnRefused func(name string, reason RefusalReason)
}

// HTTPServer runs one handler on its listeners (one, or both loopbacks)
// and shuts it down with ctx.
type HTTPServer struct {
	srv  *http.Server
	lns  []*limitListener
	done chan struct{}
	once sync.Once
}

// listenAddrs expands addr as ServeConfig.Addr says, each with the network
// to listen on.
func listenAddrs(addr string, ipv4Only bool) (addrs, networks []string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return []string{addr}, []string{"tcp"}
	}
	if host == "localhost" {
		addrs, networks = []string{net.JoinHostPort("127.0.0.1", port)}, []string{"tcp4"}
		if !ipv4Only {
			addrs, networks = append(addrs, net.JoinHostPort("::1", port)), append(networks, "tcp6")
		}
		return addrs, networks
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
		return []string{addr}, []string{"tcp4"}
	}
	return []string{addr}, []string{"tcp"}
}

// Serve starts cfg.Handler on cfg.Addr, bounded by cfg.Limits. The returned
// server runs until Shutdown.
func Serve(cfg ServeConfig) (*HTTPServer, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	lim := cfg.Limits.withDefaults()
	addrs, networks := listenAddrs(cfg.Addr, cfg.IPv4Only)
	var lns []*limitListener
	for i, a := range addrs {
		if host, port, _ := net.SplitHostPort(a); i > 0 && port == "0" {
			// localhost:0 (tests): both loopbacks on the port the first got.
			a = net.JoinHostPort(host, fmt.Sprint(lns[0].Addr().(*net.TCPAddr).Port))
		}
		inner, err := net.Listen(networks[i], a)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("listen %s: %w", a, err)
		}
		lns = append(lns, newLimitListener(inner, cfg, lim))
	}
	s := &HTTPServer{
		srv: &http.Server{
			Handler:           cfg.Handler,
			ReadHeaderTimeout: lim.HeaderTimeout,
			IdleTimeout:       lim.IdleTimeout,
			ReadTimeout:       lim.ReadTimeout,
			MaxHeaderBytes:    lim.MaxHeaderBytes,
			// No WriteTimeout: it is one deadline from the request's
			// start to the response's end, which would cut a large
			// /config_dump or /metrics going to a client that reads it;
			// limitedConn.Write bounds a stall instead.
			// Accept errors (EMFILE...) and handler panics, in the
			// daemon's log rather than on stderr.
			ErrorLog: slog.NewLogLogger(cfg.Logger.With("scope", "admin", "listener", cfg.Name).Handler(), slog.LevelWarn),
		},
		lns:  lns,
		done: make(chan struct{}),
	}
	var wg sync.WaitGroup
	for _, ln := range lns {
		wg.Go(func() {
			if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				cfg.Logger.Error("http server failed", "addr", ln.Addr().String(), "error", err, "scope", "admin")
			}
		})
	}
	go func() {
		wg.Wait()
		close(s.done)
	}()
	return s, nil
}

// Addr is the bound address (the first, IPv4's, for localhost).
func (s *HTTPServer) Addr() net.Addr { return s.lns[0].Addr() }

// Addrs are all the bound addresses.
func (s *HTTPServer) Addrs() []net.Addr {
	out := make([]net.Addr, len(s.lns))
	for i, l := range s.lns {
		out[i] = l.Addr()
	}
	return out
}

// Shutdown stops accepting at once, closes idle connections, and waits for
// the requests in flight until ctx ends, then closes what is left. Only
// the first call does anything; later ones return nil at once.
func (s *HTTPServer) Shutdown(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		err = s.srv.Shutdown(ctx)
		if err != nil {
			s.srv.Close()
		}
		<-s.done
	})
	return err
}
