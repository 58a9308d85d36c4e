package dnsproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/fdbudget"
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
	// DefaultCacheSize is ztunnel's resolver cache_size.
	DefaultCacheSize      = 4096
	DefaultMaxInFlight    = 256
	DefaultMaxTCPConns    = 64
	DefaultMaxTCPPipeline = 16
	DefaultTCPIdleTimeout = 5 * time.Second // ztunnel's TCP request timeout
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
	// order, except that one whose exchanges keep failing is tried after
	// those that answer. None makes every forwarded question fail with
	// SERVFAIL.
	Upstreams []string
	// IPv4Only is IPV6_ENABLED=false: an AAAA question for a mesh name is
	// answered with an empty authoritative NOERROR whatever the name's
	// addresses (ztunnel's service_family_allowed), so no mesh client is
	// handed an IPv6 address it could not use; A questions are answered as
	// ever and AAAA questions for other names are forwarded, as ztunnel
	// forwards them.
	IPv4Only bool
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
	// Watch, when set, serves the sockets from the caller's watcher
	// (engine.Engine.WatchReadable: ready runs when the socket is
	// readable and must not block) instead of a goroutine blocked on
	// each: the shared mode's choice, where a node's pods are many and
	// their DNS proxies nearly always quiet.
	Watch func(rc syscall.RawConn, ready func() time.Duration) (stop func(), err error)
	// Dial makes the sockets to the upstream resolvers (called inside
	// Control); nil uses a plain net.Dialer. The caller gives them the
	// proxy's mark so the capture rules do not send them back here.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// UpstreamTimeout bounds one exchange with one upstream; 0 means 2s.
	// The daemon passes resolv.conf's "options timeout:n" (ResolvConf).
	UpstreamTimeout time.Duration
	// UpstreamAttempts is how many rounds through the upstreams a
	// forwarded query gets before SERVFAIL (resolv.conf's "options
	// attempts:n"); 0 means 1.
	UpstreamAttempts int
	// CacheSize is how many upstream answers are kept for their TTL
	// (ztunnel's resolver keeps 4096: its cache_size); 0 means
	// DefaultCacheSize, negative turns the cache off.
	CacheSize int
	// MaxInFlight caps the queries forwarded upstream and not yet answered
	// (names answered from the snapshot take no slot). A query refused for
	// want of a slot is dropped over UDP (the client retries) and answered
	// SERVFAIL over TCP; Dropped counts both. 0 means 256.
	MaxInFlight int
	// MaxInFlightPerClient caps the forwarded queries in flight from one
	// client address (IP), so that one client cannot take every slot.
	// 0 means half of MaxInFlight (at least 1).
	MaxInFlightPerClient int
	// MaxTCPConns caps open TCP connections. When that many are open, a new
	// one is still accepted and evicts the connection that was active the
	// longest ago, preferring one with no query being answered (between
	// queries, stalled in one, or stuck writing to a client that does not
	// read). 0 means 64.
	MaxTCPConns int
	// MaxTCPPipeline caps the forwarded queries of one TCP connection being
	// answered at once, reply written included (RFC 7766 pipelining: replies
	// may come out of order); the connection is not read further until one
	// is done. 0 means 16.
	MaxTCPPipeline int
	// TCPIdleTimeout closes a TCP connection with no complete query for that
	// long, and bounds writing each reply to it; 0 means 5s (ztunnel's).
	TCPIdleTimeout time.Duration
	// Metrics receives the istio_dns_* counts; nil counts nothing.
	Metrics *metrics.Metrics
	// Budget is the daemon's descriptor budget (fdbudget): each TCP
	// connection takes one descriptor of its client's share, each forwarded
	// query one more for its upstream socket, so that no client of the DNS
	// proxy holds more than its share of the daemon's descriptors whatever
	// listener it floods. A refused connection is closed, a refused query
	// dropped (UDP) or answered SERVFAIL (TCP), counted in Dropped and in
	// ztunnel_go_fd_budget_refusals_total{listener="dns"}. nil is no budget.
	Budget *fdbudget.Budget
	// Logger receives start/stop lines and, at debug, one line per request
	// (scope "dns"); nil discards.
	Logger *slog.Logger
}

// Server is one workload's DNS proxy.
type Server struct {
	cfg       Config
	log       *slog.Logger
	svcDomain string
	search    []string   // resolved search domains
	fw        *forwarder // cfg.Upstreams, their records and the answer cache

	ctx    context.Context // canceled by Close: ends upstream exchanges
	cancel context.CancelFunc
	stop   chan struct{} // closed when Drain or Close starts: no new work
	once   sync.Once
	wg     sync.WaitGroup // serve loops, TCP connections, request goroutines

	fwd     *budget       // forwarded queries in flight
	dropped atomic.Uint64 // forwarded queries refused for want of a slot

	mu      sync.Mutex // guards the following fields
	addrs   []net.Addr // every bound UDP address (UDPAddrs)
	bound   *bound     // bound by Listen, until Start serves it
	udp     []net.PacketConn
	tcp     []net.Listener
	unwatch []func()     // with Config.Watch
	rawUDP  []*rawSocket // watched sockets (watch.go); closed once serving has ended
	rawTCP  []*rawSocket // closed by beginStop
	conns   map[net.Conn]*tcpConn
	clock   uint64 // ticks at every TCP connection's activity: the eviction order
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
	if cfg.MaxInFlightPerClient <= 0 {
		cfg.MaxInFlightPerClient = max(cfg.MaxInFlight/2, 1)
	}
	if cfg.MaxTCPConns <= 0 {
		cfg.MaxTCPConns = DefaultMaxTCPConns
	}
	if cfg.MaxTCPPipeline <= 0 {
		cfg.MaxTCPPipeline = DefaultMaxTCPPipeline
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
		fwd:       newBudget(cfg.MaxInFlight, cfg.MaxInFlightPerClient),
		conns:     make(map[net.Conn]*tcpConn),
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
	if cfg.CacheSize == 0 {
		cfg.CacheSize = DefaultCacheSize
		s.cfg.CacheSize = cfg.CacheSize
	}
	s.fw = newForwarder(cfg.Upstreams, cfg.Dial, cfg.Control, cfg.UpstreamTimeout, cfg.UpstreamAttempts, cfg.CacheSize)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

func trimDot(s string) string {
	if len(s) > 0 && s[len(s)-1] == '.' {
		return s[:len(s)-1]
	}
	return s
}

// bound is what Listen bound, for Start to serve: UDP and TCP of each
// address bound, and the bind errors of those that were not (IPv6 ones,
// when another bound).
type bound struct {
	udp  []net.PacketConn
	tcp  []net.Listener
	errs []error
}

func (b *bound) close() {
	for i := range b.udp {
		b.udp[i].Close()
		b.tcp[i].Close()
	}
}

// Listen binds UDP and TCP on every address on the calling goroutine,
// without Config.Control, for Start to serve: the in-pod manager calls it
// on a thread already switched into the pod's network namespace, so that a
// pod add costs one switch for every socket of the pod rather than one per
// address. Its errors are Start's (on one, nothing stays bound). Close
// before Start closes what it bound.
func (s *Server) Listen(ctx context.Context) error {
	b, err := s.bindAll(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.bound = b
	s.mu.Unlock()
	return nil
}

// bindAll binds every address in the calling thread's network namespace.
// A bind error fails it, except for an IPv6 address when another address
// was bound.
func (s *Server) bindAll(ctx context.Context) (*bound, error) {
	b := &bound{}
	for _, addr := range s.cfg.Addrs {
		pc, ln, err := s.listen(ctx, addr)
		if err != nil {
			b.errs = append(b.errs, err)
			continue
		}
		b.udp, b.tcp = append(b.udp, pc), append(b.tcp, ln)
	}
	if len(b.udp) == 0 || !onlyIPv6(s.cfg.Addrs, b.errs) {
		b.close()
		return nil, s.bindError(errors.Join(b.errs...))
	}
	return b, nil
}

func (s *Server) bindError(err error) error {
	return fmt.Errorf("dnsproxy: %s: %w", s.cfg.Client.Namespace+"/"+s.cfg.Client.Name, err)
}

// Start binds UDP and TCP on every address, unless Listen has, and starts
// serving. A bind error is returned, except for an IPv6 address when
// another address was bound: a pod with IPv6 disabled still gets its IPv4
// DNS proxy. With Config.Control every address is bound in one call of it.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	b := s.bound
	s.bound = nil
	s.mu.Unlock()
	if b == nil {
		var err error
		if cerr := s.control(func() error { b, err = s.bindAll(ctx); return nil }); cerr != nil {
			err = s.bindError(cerr)
		}
		if err != nil {
			return err
		}
	}
	udp, tcp := b.udp, b.tcp
	for _, err := range b.errs {
		s.log.Info("DNS proxy address not bound; serving on the others (no IPv6 in the pod?)", "error", err)
	}
	addrs := make([]string, 0, len(udp))
	s.mu.Lock()
	for i := range udp {
		s.addrs = append(s.addrs, udp[i].LocalAddr())
		addrs = append(addrs, udp[i].LocalAddr().String())
	}
	s.mu.Unlock()
	for i := range udp {
		if s.watch(udp[i], tcp[i]) {
			continue
		}
		s.mu.Lock()
		s.udp, s.tcp = append(s.udp, udp[i]), append(s.tcp, tcp[i])
		s.mu.Unlock()
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
// the TCP one is taken), in the calling thread's network namespace.
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
		if pc, err = lc.ListenPacket(ctx, "udp", addr); err == nil {
			if ln, err = lc.Listen(ctx, "tcp", pc.LocalAddr().String()); err != nil {
				pc.Close()
			}
		}
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
	return slices.Clone(s.addrs)
}

// Dropped returns how many forwarded queries were refused because no
// forwarding slot was free (MaxInFlight in all or MaxInFlightPerClient for
// the client): dropped over UDP, answered SERVFAIL over TCP.
func (s *Server) Dropped() uint64 { return s.dropped.Load() }

func (s *Server) stopping() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// serveUDP reads queries and answers those of mesh names on the spot: that
// is a snapshot read, and taking no slot for them keeps them answered while
// the forwarding budget is spent. A query for the upstream resolvers gets a
// goroutine of its own if a forwarding slot is free and is dropped if not.
func (s *Server) serveUDP(pc net.PacketConn) {
	defer s.wg.Done()
	// One byte over the bound: a longer datagram is cut to it, and dropped.
	buf := make([]byte, MaxRequestSize+1)
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
		s.query(buf[:n], clientAddr(from), func(out []byte) { _, _ = pc.WriteTo(out, from) })
	}
}

// query answers the datagram b from client with send (a mesh name on the
// spot, others on a goroutine of their own if a forwarding slot is free).
func (s *Server) query(b []byte, client netip.Addr, send func([]byte)) {
	// A copy: a forwarded query outlives the buffer's next read.
	out, fwd := s.prepare(s.ctx, bytes.Clone(b), false)
	if fwd == nil {
		if out != nil {
			send(out)
		}
		return
	}
	if !s.takeForward(client, "udp") {
		return // overloaded: the client retries
	}
	s.wg.Go(func() {
		defer s.releaseForward(client)
		if out := s.resolve(s.ctx, fwd); out != nil {
			send(out)
		}
	})
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
		// Off the watcher first, outside mu: a ready function running
		// there may be waiting for mu, and unwatching waits for it.
		s.mu.Lock()
		unwatch := s.unwatch
		s.unwatch = nil
		s.mu.Unlock()
		for _, stop := range unwatch {
			stop()
		}
		s.mu.Lock()
		close(s.stop)
		for _, r := range s.rawTCP {
			r.close()
		}
		for _, ln := range s.tcp {
			ln.Close()
		}
		now := time.Now()
		for _, pc := range s.udp {
			pc.SetReadDeadline(now)
		}
		for _, tc := range s.conns {
			tc.c.SetReadDeadline(now)
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
	if s.bound != nil {
		s.bound.close()
		s.bound = nil
	}
	for _, pc := range s.udp {
		pc.Close()
	}
	for _, tc := range s.conns {
		tc.c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	// Only now: a forwarded answer is sent on the socket it came in on,
	// and a descriptor closed earlier could by then be another socket's.
	s.mu.Lock()
	for _, r := range s.rawUDP {
		r.close()
	}
	s.mu.Unlock()
}
