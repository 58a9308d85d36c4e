package dnsproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/state"
)

// Port is ztunnel's DNS proxy port.
const Port = 15053

// DefaultAddrs are where the proxy listens by default: both loopbacks of
// the workload's namespace, as ztunnel does. The capture rules redirect the
// pod's port-53 traffic there.
var DefaultAddrs = []string{"127.0.0.1:15053", "[::1]:15053"}

// Defaults of the bounds (Config's zero values).
const (
	DefaultDomain          = "cluster.local"
	DefaultUpstreamTimeout = 2 * time.Second
	DefaultMaxInFlight     = 256
	DefaultMaxTCPConns     = 64
	DefaultTCPIdleTimeout  = 5 * time.Second // ztunnel's TCP request timeout
	// MaxRequestSize bounds a query: real ones are a few hundred bytes.
	MaxRequestSize = 4096
	// TTL is the TTL of every local answer, in seconds (ztunnel's).
	TTL = 30
)

// Config configures one workload's DNS proxy.
type Config struct {
	// State is the snapshot store answers come from. Required.
	State *state.Store
	// Client is the workload whose DNS this proxy serves (its namespace
	// decides the search aliases and which services are visible).
	// Namespace is required.
	Client state.WorkloadInfo
	// Network is the node's network, used for the client when its workload
	// is not (yet) in the snapshot.
	Network string
	// Domain is the cluster domain (CLUSTER_DOMAIN); "" means cluster.local.
	Domain string
	// SearchDomains are the client's resolver search domains, which a
	// question may carry and which are stripped to find the service. nil
	// means the Kubernetes defaults for the client's namespace:
	// <ns>.svc.<domain>, svc.<domain>, <domain> (ztunnel's shared mode).
	SearchDomains []string
	// PreferredNamespace breaks ties between services of one hostname after
	// the client's namespace and canonical services (PREFERED_SERVICE_NAMESPACE).
	PreferredNamespace string
	// Upstreams are the resolvers unknown names go to, "host:port", tried in
	// order. None makes every forwarded question fail with SERVFAIL.
	Upstreams []string
	// Addrs are the listen addresses, UDP and TCP on each; nil means
	// DefaultAddrs. An IPv6 address that cannot be bound (a pod without
	// IPv6) is skipped with a log line when another address was bound.
	Addrs []string
	// Control, when set, runs socket creation (listen and upstream dial)
	// inside the workload's network namespace.
	Control func(fn func() error) error
	// ListenControl is applied to the listening sockets (SO_MARK,
	// SO_REUSEPORT); nil applies nothing.
	ListenControl func(network, address string, c syscall.RawConn) error
	// Dial makes the sockets to the upstream resolvers (called inside
	// Control); nil uses a plain net.Dialer. The caller gives them the
	// proxy's mark so the capture rules do not send them back here.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// UpstreamTimeout bounds one exchange with one upstream; 0 means 2s.
	UpstreamTimeout time.Duration
	// MaxInFlight caps requests being answered at once; more UDP queries are
	// dropped (the client retries) and TCP queries wait. 0 means 256.
	MaxInFlight int
	// MaxTCPConns caps open TCP connections; 0 means 64.
	MaxTCPConns int
	// TCPIdleTimeout closes a TCP connection with no complete query for that
	// long; 0 means 5s.
	TCPIdleTimeout time.Duration
	// Metrics receives the istio_dns_* counts; nil counts nothing.
	Metrics *metrics.Metrics
	// Logger receives start/stop lines and, at debug, one line per request
	// (scope "dns"); nil discards.
	Logger *slog.Logger
}

// Server is one workload's DNS proxy.
type Server struct {
	cfg       Config
	log       *slog.Logger
	svcDomain string
	search    []string // resolved search domains

	ctx    context.Context // canceled by Close: ends upstream exchanges
	cancel context.CancelFunc
	stop   chan struct{} // closed when Drain or Close starts: no new work
	once   sync.Once
	wg     sync.WaitGroup // serve loops, TCP connections, request goroutines

	inflight chan struct{}
	tcpSlots chan struct{}
	dropped  atomic.Uint64 // UDP queries dropped for MaxInFlight

	mu    sync.Mutex // guards the following fields
	udp   []net.PacketConn
	tcp   []net.Listener
	conns map[net.Conn]struct{}
}

// New validates cfg and returns a server that has not opened anything.
func New(cfg Config) (*Server, error) {
	if cfg.State == nil {
		return nil, errors.New("dnsproxy: State is required")
	}
	if cfg.Client.Namespace == "" {
		return nil, errors.New("dnsproxy: the client's namespace is required")
	}
	if cfg.Domain == "" {
		cfg.Domain = DefaultDomain
	}
	cfg.Domain = lowerASCII(trimDot(cfg.Domain))
	if cfg.Addrs == nil {
		cfg.Addrs = DefaultAddrs
	}
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("dnsproxy: no listen address")
	}
	for _, u := range cfg.Upstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			return nil, fmt.Errorf("dnsproxy: upstream %q: %w", u, err)
		}
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxTCPConns <= 0 {
		cfg.MaxTCPConns = DefaultMaxTCPConns
	}
	if cfg.TCPIdleTimeout <= 0 {
		cfg.TCPIdleTimeout = DefaultTCPIdleTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg: cfg, log: log.With("scope", "dns"),
		svcDomain: "svc." + cfg.Domain,
		stop:      make(chan struct{}),
		inflight:  make(chan struct{}, cfg.MaxInFlight),
		tcpSlots:  make(chan struct{}, cfg.MaxTCPConns),
		conns:     make(map[net.Conn]struct{}),
	}
	if cfg.SearchDomains != nil {
		for _, d := range cfg.SearchDomains {
			if d = lowerASCII(trimDot(d)); d != "" {
				s.search = append(s.search, d)
			}
		}
	} else {
		s.search = []string{cfg.Client.Namespace + "." + s.svcDomain, s.svcDomain, cfg.Domain}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

func trimDot(s string) string {
	if len(s) > 0 && s[len(s)-1] == '.' {
		return s[:len(s)-1]
	}
	return s
}

// Start binds UDP and TCP on every address and starts serving. A bind
// error is returned, except for an IPv6 address when another address was
// bound: a pod with IPv6 disabled still gets its IPv4 DNS proxy.
func (s *Server) Start(ctx context.Context) error {
	var (
		udp  []net.PacketConn
		tcp  []net.Listener
		errs []error
	)
	for _, addr := range s.cfg.Addrs {
		pc, ln, err := s.listen(ctx, addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		udp, tcp = append(udp, pc), append(tcp, ln)
	}
	if len(udp) == 0 || !onlyIPv6(s.cfg.Addrs, errs) {
		for i := range udp {
			udp[i].Close()
			tcp[i].Close()
		}
		return fmt.Errorf("dnsproxy: %s: %w", s.cfg.Client.Namespace+"/"+s.cfg.Client.Name, errors.Join(errs...))
	}
	for _, err := range errs {
		s.log.Info("DNS proxy address not bound; serving on the others (no IPv6 in the pod?)", "error", err)
	}
	s.mu.Lock()
	s.udp, s.tcp = udp, tcp
	s.mu.Unlock()
	addrs := make([]string, 0, len(udp))
	for i := range udp {
		addrs = append(addrs, udp[i].LocalAddr().String())
		s.wg.Add(2)
		go s.serveUDP(udp[i])
		go s.serveTCP(tcp[i])
	}
	s.log.Info("starting local DNS server", "workload", s.cfg.Client.Namespace+"/"+s.cfg.Client.Name,
		"address", addrs, "upstreams", s.cfg.Upstreams)
	return nil
}

// onlyIPv6 reports whether every bind error is for an IPv6 address.
func onlyIPv6(addrs []string, errs []error) bool {
	for _, err := range errs {
		var be *bindError
		if !errors.As(err, &be) || !be.v6 {
			return false
		}
	}
	return true
}

type bindError struct {
	addr string
	v6   bool
	err  error
}

func (e *bindError) Error() string { return "bind " + e.addr + ": " + e.err.Error() }
func (e *bindError) Unwrap() error { return e.err }

// listen binds UDP on addr, then TCP on the same address and port (the
// UDP's, so that port 0 gives one port for both; a few ports are tried when
// the TCP one is taken).
func (s *Server) listen(ctx context.Context, addr string) (net.PacketConn, net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dnsproxy: listen address %q: %w", addr, err)
	}
	ip, _ := netip.ParseAddr(host)
	lc := net.ListenConfig{Control: s.cfg.ListenControl}
	var (
		pc net.PacketConn
		ln net.Listener
	)
	for range 8 {
		err = s.control(func() error {
			var err error
			if pc, err = lc.ListenPacket(ctx, "udp", addr); err != nil {
				return err
			}
			if ln, err = lc.Listen(ctx, "tcp", pc.LocalAddr().String()); err != nil {
				pc.Close()
				return err
			}
			return nil
		})
		if err == nil || port != "0" || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		return nil, nil, &bindError{addr: addr, v6: ip.Is6() && !ip.Is4In6(), err: err}
	}
	return pc, ln, nil
}

func (s *Server) control(fn func() error) error {
	if s.cfg.Control == nil {
		return fn()
	}
	return s.cfg.Control(fn)
}

// UDPAddrs returns the bound UDP addresses (TCP listens on the same ones).
func (s *Server) UDPAddrs() []net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]net.Addr, 0, len(s.udp))
	for _, pc := range s.udp {
		out = append(out, pc.LocalAddr())
	}
	return out
}

// Dropped returns how many UDP queries were dropped because MaxInFlight
// queries were already being answered.
func (s *Server) Dropped() uint64 { return s.dropped.Load() }

func (s *Server) stopping() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// serveUDP reads queries and answers each in a goroutine of its own, at
// most MaxInFlight at once; a query beyond that is dropped.
func (s *Server) serveUDP(pc net.PacketConn) {
	defer s.wg.Done()
	buf := make([]byte, 65535)
	var backoff time.Duration
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if !s.pause(&backoff, "DNS read failed", pc.LocalAddr(), err) {
				return
			}
			continue
		}
		backoff = 0
		if n > MaxRequestSize {
			continue
		}
		select {
		case s.inflight <- struct{}{}:
		default:
			s.dropped.Add(1)
			continue // overloaded: the client retries
		}
		req := bytes.Clone(buf[:n])
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.inflight }()
			if resp := s.handle(s.ctx, req, false); resp != nil {
				_, _ = pc.WriteTo(resp, from)
			}
		}()
	}
}

// pause handles a failed read or accept on the socket at addr: it reports
// false when the socket is closed or the server stopping, else logs msg and
// waits out the next backoff (5 ms doubling up to 1 s, reset by the caller
// on success) so that a persistent error does not spin, and reports true.
func (s *Server) pause(backoff *time.Duration, msg string, addr net.Addr, err error) bool {
	if errors.Is(err, net.ErrClosed) || s.stopping() {
		return false
	}
	*backoff = min(max(*backoff*2, 5*time.Millisecond), time.Second)
	s.log.Warn(msg, "addr", addr.String(), "error", err)
	select {
	case <-time.After(*backoff):
		return true
	case <-s.stop:
		return false
	}
}

// serveTCP accepts connections, at most MaxTCPConns open at once (beyond
// that they wait in the kernel's backlog).
func (s *Server) serveTCP(ln net.Listener) {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		select {
		case s.tcpSlots <- struct{}{}:
		case <-s.stop:
			return
		}
		c, err := ln.Accept()
		if err != nil {
			<-s.tcpSlots
			if !s.pause(&backoff, "DNS accept failed", ln.Addr(), err) {
				return
			}
			continue
		}
		backoff = 0
		if !s.track(c) {
			c.Close()
			<-s.tcpSlots
			return
		}
		s.wg.Add(1)
		go s.serveConn(c)
	}
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping() {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

// serveConn answers length-prefixed queries one after the other until the
// client closes, stays idle for TCPIdleTimeout, or sends a bad length.
func (s *Server) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
		<-s.tcpSlots
	}()
	var hdr [2]byte
	for {
		if s.stopping() {
			return
		}
		c.SetReadDeadline(time.Now().Add(s.cfg.TCPIdleTimeout))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(hdr[:]))
		if n == 0 || n > MaxRequestSize {
			return
		}
		req := make([]byte, n)
		if _, err := io.ReadFull(c, req); err != nil {
			return
		}
		select {
		case s.inflight <- struct{}{}:
		case <-s.stop:
			return
		}
		resp := s.handle(s.ctx, req, true)
		<-s.inflight
		if resp == nil {
			return
		}
		out := make([]byte, 2+len(resp))
		binary.BigEndian.PutUint16(out, uint16(len(resp)))
		copy(out[2:], resp)
		c.SetWriteDeadline(time.Now().Add(s.cfg.TCPIdleTimeout))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// Drain stops reading new queries at once, lets the ones being answered
// finish until ctx is done, then closes everything.
func (s *Server) Drain(ctx context.Context) {
	s.beginStop()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	s.Close()
}

// beginStop closes the listeners and wakes every blocked read, so the
// serve loops end; sockets that answer in-flight queries stay open.
func (s *Server) beginStop() {
	s.once.Do(func() {
		s.mu.Lock()
		close(s.stop)
		for _, ln := range s.tcp {
			ln.Close()
		}
		now := time.Now()
		for _, pc := range s.udp {
			pc.SetReadDeadline(now)
		}
		for c := range s.conns {
			c.SetReadDeadline(now)
		}
		s.mu.Unlock()
	})
}

// Close stops at once: upstream exchanges are abandoned and every socket
// closed. It returns when every goroutine of the server has ended.
func (s *Server) Close() {
	s.beginStop()
	s.cancel()
	s.mu.Lock()
	for _, pc := range s.udp {
		pc.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
