package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/proxy/connmgr"
	"github.com/ztunnel-go/ztunnel/state"
)

// Ports of the listeners a proxy opens in its pod's network namespace.
const (
	OutboundPort     = 15001
	InboundPlainPort = 15006
	InboundHBONEPort = 15008
	// SOCKS5Port is the optional SOCKS5 listener (UNSTABLE_ENABLE_SOCKS5),
	// bound to 127.0.0.1 only, as ztunnel does.
	SOCKS5Port = 15080
)

// WorkloadRef names the workload a proxy serves (PROXY_WORKLOAD_INFO in
// dedicated mode, the ZDS workload info in shared mode).
type WorkloadRef struct {
	Namespace, Name, ServiceAccount string
	// Node and Cluster scope the lookup of the workload record to this
	// node (NODE_NAME) and cluster (CLUSTER_ID), as ztunnel's local_node:
	// a same-named pod elsewhere is never taken for it. "" matches any.
	Node, Cluster string
}

func (r WorkloadRef) String() string { return r.Namespace + "/" + r.Name }

// Info is the snapshot lookup key of the workload.
func (r WorkloadRef) Info() state.WorkloadInfo {
	return state.WorkloadInfo{Namespace: r.Namespace, Name: r.Name, ServiceAccount: r.ServiceAccount, Node: r.Node, Cluster: r.Cluster}
}

// Config configures one proxy instance: the listeners and decisions for one
// workload.
type Config struct {
	// Workload is the workload this proxy serves.
	Workload WorkloadRef
	// TrustDomain is the trust domain of the served workload's identity when
	// the workload record does not say (default cluster.local).
	TrustDomain string
	// Network is this node's network (NETWORK).
	Network string
	// State is the published workload/service/policy snapshot.
	State *state.Store
	// Certs supplies workload certificates.
	Certs *mtls.Store
	// Pool carries outbound HBONE streams. Shared between proxies of a node
	// is fine: keys include the source identity and IP.
	Pool *hbone.Pool
	// HBONE tunes the inbound HTTP/2 server.
	HBONE hbone.Config
	// PoolInnerHBONE pools the inner tunnel of double HBONE
	// (ZTUNNEL_POOL_INNER_HBONE; ztunnel never does): inner connections to
	// one destination through one gateway carry many streams instead of one
	// TLS handshake each. Only used when the destination is a known HBONE
	// workload, whose ztunnel treats every inner CONNECT on its own; the
	// cost is that the gateway balances connections, not streams, so the
	// streams of one inner connection all reach the endpoint it chose first.
	PoolInnerHBONE bool
	// Engine runs the relays. The daemon makes one and hands it to every
	// proxy (the in-pod manager's per-pod proxies too) and closes it after
	// they are drained. Nil gives the proxy an engine of its own
	// (engine.Config{}), closed when the proxy is.
	Engine *engine.Engine
	// Socket options for every socket made for this workload (PACKET_MARK,
	// keepalive). Listeners additionally get SO_REUSEPORT when ReusePort.
	Socket engine.SocketOptions
	// ReusePort sets SO_REUSEPORT on the listeners (INPOD_PORT_REUSE).
	ReusePort bool
	// OrigSrc controls original-source spoofing towards the local app:
	// nil = best effort, else forced on or off (ENABLE_ORIG_SRC).
	OrigSrc *bool
	// BindHost is the listener host; "" means "[::]" (dual stack).
	BindHost string
	// Ports override the listener ports (0 = the standard ones); tests use it.
	OutboundPort, InboundPlainPort, InboundHBONEPort, SOCKS5Port int
	// SOCKS5 opens the SOCKS5 listener on 127.0.0.1 (UNSTABLE_ENABLE_SOCKS5).
	SOCKS5 bool
	// InboundOnly opens the inbound HBONE listener alone: the daemon's
	// self-proxy, which lets mesh clients reach the daemon's own ports
	// (15020 metrics) over HBONE, as ztunnel's does. It captures nothing.
	InboundOnly bool
	// DirectAppTunnel dials a workload's application tunnel (PROXY
	// protocol) at its pod address rather than over loopback
	// (LOCALHOST_APP_TUNNEL=false; the zero value is ztunnel's default).
	DirectAppTunnel bool
	// LocalWorkloadWait bounds how long a connection waits for this proxy's
	// own workload to appear in the snapshot (ztunnel: 5s).
	LocalWorkloadWait time.Duration
	// Control, when set, runs socket creation (listen and dial) in the
	// workload's network namespace.
	Control func(fn func() error) error
	// Logger receives access logs (scope "access") and errors; nil discards.
	Logger *slog.Logger
	// Metrics counts connections and bytes; nil counts nothing.
	Metrics *metrics.Metrics
	// Conns tracks authorized inbound connections so a policy change can
	// close the ones it now denies; nil tracks nothing.
	Conns *connmgr.Manager
	// CRL refuses peers with a revoked certificate in the handshake, both
	// ways, and when a reload revokes the peer of an open inbound HBONE
	// connection, closes it (crl.go); nil enforces no CRL (CRL_PATH unset).
	// The caller closes the outbound Pool's connections itself, as the
	// pool may be shared between proxies.
	CRL *mtls.CRL
	// PreferredServiceNamespace breaks ties between services sharing a VIP
	// after the client's namespace and a canonical service
	// (PREFERED_SERVICE_NAMESPACE); "" prefers none.
	PreferredServiceNamespace string
	// Resolver resolves hostname-only workloads on demand and SOCKS5 domain
	// targets that are not service hostnames; nil means net.DefaultResolver.
	Resolver Resolver
	// TLS is the daemon's TLS policy for HBONE (COMPLIANCE_POLICY); the
	// zero value is ztunnel's default.
	TLS mtls.Policy
	// PolicyInfoLogging logs policy decisions' details (the dry-run
	// outcomes) at info instead of debug (AUTHZ_POLICY_INFO_LOGGING).
	PolicyInfoLogging bool
	// OnDemand, when set (XDS_ON_DEMAND), fetches addresses the snapshot
	// lacks from the control plane before a connection is routed: the
	// outbound destination, the inbound source and a waypoint's tunnel
	// target, as ztunnel's fetch_address, fetch_workload_by_address and
	// validate_destination. Nil: the snapshot is all
	// there is.
	OnDemand Demand
	// OnDemandWait bounds each on-demand wait; zero means
	// DefaultOnDemandWait.
	OnDemandWait time.Duration
	// HandshakeTimeout bounds the TLS handshake on 15008, so a peer that
	// connects and sends nothing cannot hold a goroutine. Default 10s.
	HandshakeTimeout time.Duration
	// MaxHBONEHandshakesPerPeer bounds the TLS handshakes in progress on
	// 15008 from one source IP; connections beyond it are closed at once.
	// A legitimate peer dials one connection per pool key at a time.
	// Default 128; negative means no limit.
	MaxHBONEHandshakesPerPeer int
	// MaxHBONEConnsPerPeer bounds the HBONE connections (handshaking or
	// established) on 15008 from one source IP; connections beyond it are
	// closed at once. A pooled peer needs one per 100 concurrent streams.
	// Default 2048; negative means no limit.
	MaxHBONEConnsPerPeer int
}

// Defaults of the 15008 limits.
const (
	DefaultHandshakeTimeout          = 10 * time.Second
	DefaultMaxHBONEHandshakesPerPeer = 128
	DefaultMaxHBONEConnsPerPeer      = 2048
)

// Proxy serves one workload: outbound, inbound HBONE and inbound plaintext.
type Proxy struct {
	cfg    Config
	rnd    func(n uint64) uint64 // load-balancing randomness; nil = math/rand/v2
	log    *slog.Logger
	access *slog.Logger // log.With("scope", "access"), made once
	hbsrv  *hbone.Server
	dialer engine.Dialer
	engine *engine.Engine
	// ownEngine: cfg.Engine was nil, so the proxy made engine and closes it.
	ownEngine bool

	origSrc bool
	info    state.WorkloadInfo
	baggage baggageCache // baggage of the served workload, for CONNECT and 200

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // accept loops and connection goroutines

	ownID atomic.Pointer[workloadIdentity] // ownIdentity's

	stopCRL func() // ends the CRL subscription Start made; nil without one

	mu        sync.Mutex // guards the following fields
	listeners []*net.TCPListener
	conns     map[*net.TCPConn]struct{} // accepted connections until relayed
	// relays are the relayed connections, each at its relayIdx: a slice
	// costs an idle connection 8 bytes where a map entry costs ~36.
	relays []*conn
	closed bool
	peers  map[netip.Addr]*peerCount // 15008 connections per source IP
}

// New validates cfg and returns a proxy that has not opened anything yet.
func New(cfg Config) (*Proxy, error) {
	if cfg.State == nil || cfg.Certs == nil || cfg.Pool == nil {
		return nil, errors.New("proxy: State, Certs and Pool are required")
	}
	if cfg.Workload.Namespace == "" || cfg.Workload.Name == "" {
		return nil, errors.New("proxy: workload namespace and name are required")
	}
	if cfg.LocalWorkloadWait == 0 {
		cfg.LocalWorkloadWait = 5 * time.Second
	}
	if cfg.BindHost == "" {
		cfg.BindHost = "::"
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.OutboundPort == 0 {
		cfg.OutboundPort = OutboundPort
	}
	if cfg.InboundPlainPort == 0 {
		cfg.InboundPlainPort = InboundPlainPort
	}
	if cfg.InboundHBONEPort == 0 {
		cfg.InboundHBONEPort = InboundHBONEPort
	}
	if cfg.SOCKS5Port == 0 {
		cfg.SOCKS5Port = SOCKS5Port
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxHBONEHandshakesPerPeer == 0 {
		cfg.MaxHBONEHandshakesPerPeer = DefaultMaxHBONEHandshakesPerPeer
	}
	if cfg.MaxHBONEConnsPerPeer == 0 {
		cfg.MaxHBONEConnsPerPeer = DefaultMaxHBONEConnsPerPeer
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{cfg: cfg, log: log, access: log.With("scope", "access"), conns: make(map[*net.TCPConn]struct{}),
		peers: make(map[netip.Addr]*peerCount)}
	p.info = cfg.Workload.Info()
	if p.engine = cfg.Engine; p.engine == nil {
		e, err := engine.New(engine.Config{})
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		p.engine, p.ownEngine = e, true
	}
	p.dialer = engine.Dialer{Options: cfg.Socket}
	if cfg.Control != nil {
		p.dialer.Control = func(dial func() (net.Conn, error)) (c net.Conn, err error) {
			cerr := cfg.Control(func() error { c, err = dial(); return nil })
			if cerr != nil {
				return nil, cerr
			}
			return c, err
		}
	}
	hcfg := cfg.HBONE
	if hcfg.Logf == nil {
		hcfg.Logf = func(format string, args ...any) { log.Debug(fmt.Sprintf(format, args...), "scope", "hbone") }
	}
	if cfg.CRL != nil {
		hcfg.Admit = p.admitInbound // crl.go
	}
	p.hbsrv = hbone.NewServer(hcfg, p.serveHBONE)
	return p, nil
}

// Start opens the three listeners and starts serving. Listener errors (a
// port in use, a missing capability) are returned before anything runs.
func (p *Proxy) Start(ctx context.Context) error {
	p.ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	lopts := p.cfg.Socket
	lopts.ReusePort = p.cfg.ReusePort
	// Transparent listeners are not needed for REDIRECT capture; original
	// source spoofing is a property of the sockets we dial.
	lopts.Transparent = false
	p.origSrc = p.cfg.OrigSrc == nil || *p.cfg.OrigSrc

	type spec struct {
		host  string
		port  int
		serve func(*net.TCPConn) bool
	}
	specs := []spec{
		{p.cfg.BindHost, p.cfg.OutboundPort, p.handleOutbound},
		{p.cfg.BindHost, p.cfg.InboundPlainPort, p.handlePassthrough},
		{p.cfg.BindHost, p.cfg.InboundHBONEPort, p.handleHBONE},
	}
	if p.cfg.InboundOnly {
		specs = specs[2:]
	} else if p.cfg.SOCKS5 {
		// Loopback only: SOCKS5 has no authentication, so only the pod's own
		// processes may use it.
		specs = append(specs, spec{"127.0.0.1", p.cfg.SOCKS5Port, p.handleSOCKS5})
	}
	var lns []*net.TCPListener
	for _, s := range specs {
		addr := net.JoinHostPort(s.host, fmt.Sprint(s.port))
		var ln *net.TCPListener
		listen := func() error {
			var err error
			ln, err = engine.Listen(ctx, addr, lopts)
			return err
		}
		var err error
		if p.cfg.Control != nil {
			err = p.cfg.Control(listen)
		} else {
			err = listen()
		}
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("proxy %s: %w", p.cfg.Workload, err)
		}
		lns = append(lns, ln)
	}
	p.mu.Lock()
	p.listeners = lns
	p.mu.Unlock()
	p.watchCRL() // crl.go
	for i, s := range specs {
		p.wg.Add(1)
		go p.acceptLoop(lns[i], s.serve)
	}
	if p.cfg.InboundOnly {
		p.log.Info("self-proxy started", "workload", p.cfg.Workload.String(), "inbound_hbone", lns[0].Addr().String())
		return nil
	}
	p.log.Info("proxy started", "workload", p.cfg.Workload.String(),
		"outbound", lns[0].Addr().String(), "inbound_plaintext", lns[1].Addr().String(), "inbound_hbone", lns[2].Addr().String(),
		"socks5", p.cfg.SOCKS5)
	return nil
}

// Addrs returns the listener addresses (outbound, inbound plaintext, inbound
// HBONE, then SOCKS5 when enabled).
func (p *Proxy) Addrs() []net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []net.Addr
	for _, l := range p.listeners {
		out = append(out, l.Addr())
	}
	return out
}

// A serve function returns true when it handed the connection to the
// engine, whose completion callback then calls release; its goroutine is
// free again at once, so an idle relayed connection holds none.
//
// Connections are served by workers: goroutines that take the next
// accepted connection when they finish one and end after workerIdle
// without work, or when the listener closes. A worker's stack has already
// grown to what routing and dialing need; a goroutine per connection paid
// that growth (and its allocation) every time.
func (p *Proxy) acceptLoop(ln *net.TCPListener, serve func(*net.TCPConn) bool) {
	defer p.wg.Done()
	work := make(chan *net.TCPConn)
	defer close(work) // idle workers end
	var backoff time.Duration
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (EMFILE and friends): back off and keep serving.
			backoff = min(max(backoff*2, 5*time.Millisecond), time.Second)
			p.log.Warn("accept failed", "addr", ln.Addr().String(), "error", err)
			select {
			case <-time.After(backoff):
				continue
			case <-p.ctx.Done():
				return
			}
		}
		backoff = 0
		if !p.track(c) {
			c.Close()
			return
		}
		// No engine.Accepted: the listener's keepalive and TCP_NODELAY are
		// already the accepted socket's (engine.Listen).
		p.wg.Add(1) // the connection's; release ends it
		select {
		case work <- c: // an idle worker takes it
		default:
			p.wg.Add(1) // the worker's
			go p.worker(c, work, serve)
		}
	}
}

// workerIdle is how long a connection worker waits for its next connection
// before it ends.
const workerIdle = 5 * time.Second

// worker serves c, then the connections it is handed on work, until work
// closes or none comes for workerIdle.
func (p *Proxy) worker(c *net.TCPConn, work <-chan *net.TCPConn, serve func(*net.TCPConn) bool) {
	defer p.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		if !serve(c) {
			p.release(c)
		}
		idle.Reset(workerIdle)
		select {
		case next, ok := <-work:
			if !ok {
				return
			}
			c = next
		case <-idle.C:
			return
		}
	}
}

func (p *Proxy) track(c *net.TCPConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

// release ends the proxy's ownership of an accepted connection c that was
// not relayed.
func (p *Proxy) release(c *net.TCPConn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	p.wg.Done()
}

// Drain stops accepting at once, asks HBONE peers to go away (GOAWAY), lets
// open connections finish until ctx is done, then closes the rest. It returns
// once every goroutine the proxy started has ended.
func (p *Proxy) Drain(ctx context.Context) {
	if p.ownEngine {
		// After the relays: they have ended once p.wg is done.
		defer p.engine.Close()
	}
	p.mu.Lock()
	lns := p.listeners
	p.listeners = nil
	p.mu.Unlock()
	for _, l := range lns {
		l.Close()
	}
	if p.cancel == nil {
		return
	}
	if p.stopCRL != nil {
		p.stopCRL()
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	_ = p.hbsrv.Shutdown(ctx)
	select {
	case <-done:
	case <-ctx.Done():
	}
	p.cancel()
	p.hbsrv.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		engine.TCPEndpoint{TCPConn: c}.Abort()
	}
	for _, cn := range p.relays {
		cn.abortRelay()
	}
	p.mu.Unlock()
	<-done
}

// Close is Drain with no grace period.
func (p *Proxy) Close() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.Drain(ctx)
}

// localWorkload finds the workload this proxy serves, waiting up to
// LocalWorkloadWait for it to appear (ztunnel's 5s wait for xDS).
func (p *Proxy) localWorkload(ctx context.Context) (*state.Workload, *state.Snapshot, error) {
	// The common case, once per connection: the workload is known; no timer.
	snap := p.cfg.State.Load()
	if w := snap.FindWorkload(p.info); w != nil {
		return w, snap, nil
	}
	deadline := time.NewTimer(p.cfg.LocalWorkloadWait)
	defer deadline.Stop()
	for {
		changed := p.cfg.State.Changed()
		snap := p.cfg.State.Load()
		if w := snap.FindWorkload(p.info); w != nil {
			return w, snap, nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil, nil, fmt.Errorf("failed to fetch information about local workload %s", p.cfg.Workload)
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// identityOf returns the identity the proxy's workload presents.
// ownIdentity is p.identityOf(w) for w, the proxy's own workload, shared by
// the outbound connections made while w is current, which point at it
// rather than each holding a copy.
func (p *Proxy) ownIdentity(w *state.Workload) *identity.Identity {
	if c := p.ownID.Load(); c != nil && c.w == w {
		return &c.id
	}
	c := &workloadIdentity{w: w, id: p.identityOf(w)}
	p.ownID.Store(c)
	return &c.id
}

// workloadIdentity is a workload and its identity (ownIdentity).
type workloadIdentity struct {
	w  *state.Workload
	id identity.Identity
}

func (p *Proxy) identityOf(w *state.Workload) identity.Identity {
	id := w.Identity()
	if w.TrustDomain == "" && p.cfg.TrustDomain != "" {
		id.TrustDomain = p.cfg.TrustDomain
	}
	return id
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// isIllegalPort reports whether port is one of the proxy's own listener
// ports, which must never be a connection's final target (self-call loops).
func (p *Proxy) isIllegalPort(port uint16) bool {
	switch int(port) {
	case p.cfg.OutboundPort, p.cfg.InboundPlainPort, p.cfg.InboundHBONEPort:
		return true
	}
	return p.cfg.SOCKS5 && int(port) == p.cfg.SOCKS5Port
}
