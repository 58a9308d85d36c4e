package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
)

// Proxy serves one workload: outbound, inbound HBONE and inbound plaintext.
type Proxy struct {
	cfg Config
	// router makes the routing decisions the handlers ask for (router.go).
	router *router
	log    *slog.Logger
	access *slog.Logger // log.With("scope", "access"), made once
	hbsrv  *hbone.Server
	dialer engine.Dialer
	engine *engine.Engine
	// ownEngine: cfg.Engine was nil, so the proxy made engine and closes it.
	ownEngine bool

	origSrc bool
	baggage baggageCache // baggage of the served workload, for CONNECT and 200

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // accept loops and connection goroutines

	stopCRL func() // ends the CRL subscription Start made; nil without one

	mu        sync.Mutex // guards the following fields
	listeners []*net.TCPListener
	listened  bool                      // listeners opened (by Listen or Start)
	watched   []*watchedListener        // with Config.WatchListeners
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
	cfg.setDefaults()
	// The router's loggers are the proxy's: one pair, made once.
	rt := newRouter(&cfg)
	log := rt.log
	p := &Proxy{cfg: cfg, router: rt, log: log, access: rt.access, conns: make(map[*net.TCPConn]struct{}),
		peers: make(map[netip.Addr]*peerCount)}
	if p.engine = cfg.Engine; p.engine == nil {
		e, err := engine.New(engine.Config{})
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		p.engine, p.ownEngine = e, true
	}
	p.dialer = engine.Dialer{Options: cfg.Socket}
	if control := cfg.Control; control != nil {
		// The closure holds the function, not cfg: capturing cfg would move
		// a second copy of the Config (~0.5 KiB) to the heap per proxy.
		p.dialer.Control = func(dial func() (net.Conn, error)) (c net.Conn, err error) {
			cerr := control(func() error { c, err = dial(); return nil })
			if cerr != nil {
				return nil, cerr
			}
			return c, err
		}
	}
	hcfg := cfg.HBONE
	if hcfg.Logf == nil {
		hcfg.Logf = func(format string, args ...any) {
			log.Debug(fmt.Sprintf(format, args...), "scope", "proxy::h2::server")
		}
	}
	if cfg.CRL != nil {
		hcfg.Admit = p.admitInbound // crl.go
	}
	p.hbsrv = hbone.NewServer(hcfg, p.serveHBONE)
	return p, nil
}

// listenSpec is one listener of the proxy: its address, the budget its
// connections take (budget.go) and the handler that serves them.
type listenSpec struct {
	host  string
	port  int
	use   budgetUse
	serve func(*net.TCPConn) bool
}

// specs lists the proxy's listeners in the order Start opens them
// (outbound, inbound plaintext, inbound HBONE, then SOCKS5), as Addrs
// returns them.
func (p *Proxy) specs() []listenSpec {
	specs := []listenSpec{
		{p.cfg.BindHost, p.cfg.OutboundPort, budgetUse{listenerOutbound, budgetSocket}, p.handleOutbound},
		{p.cfg.BindHost, p.cfg.InboundPlainPort, budgetUse{listenerInboundPlain, budgetSocket + budgetUpstream}, p.handlePassthrough},
		{p.cfg.BindHost, p.cfg.InboundHBONEPort, budgetUse{listenerInboundHBONE, budgetSocket}, p.handleHBONE},
	}
	if p.cfg.InboundOnly {
		return specs[2:]
	}
	if p.cfg.SOCKS5 {
		// Loopback only: SOCKS5 has no authentication, so only the pod's own
		// processes may use it.
		specs = append(specs, listenSpec{"127.0.0.1", p.cfg.SOCKS5Port, budgetUse{listenerSOCKS5, budgetSocket}, p.handleSOCKS5})
	}
	return specs
}

// Listen opens the proxy's listeners on the calling goroutine, without
// Config.Control, for Start to serve: the in-pod manager calls it on a
// thread already switched into the pod's network namespace, so that a pod
// add costs one switch for all of them (and whatever else the add does
// there) rather than one per listener. Its errors are Start's: on one,
// every listener it opened is closed. Close before Start closes them.
func (p *Proxy) Listen(ctx context.Context) error {
	lns, err := p.listenAll(ctx)
	if err != nil {
		return fmt.Errorf("proxy %s: %w", p.cfg.Workload, err)
	}
	p.mu.Lock()
	p.listeners, p.listened = lns, true
	p.mu.Unlock()
	return nil
}

// listenAll opens every listener of specs in the calling thread's network
// namespace; on an error it closes those it opened.
func (p *Proxy) listenAll(ctx context.Context) ([]*net.TCPListener, error) {
	lopts := p.cfg.Socket
	lopts.ReusePort = p.cfg.ReusePort
	// Transparent listeners are not needed for REDIRECT capture; original
	// source spoofing is a property of the sockets we dial.
	lopts.Transparent = false
	specs := p.specs()
	lns := make([]*net.TCPListener, 0, len(specs))
	for _, s := range specs {
		ln, err := engine.Listen(ctx, net.JoinHostPort(s.host, strconv.Itoa(s.port)), lopts)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, err
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// Start opens the listeners, unless Listen has, and starts serving.
// Listener errors (a port in use, a missing capability) are returned before
// anything runs. With Config.Control every listener is opened in one call
// of it.
func (p *Proxy) Start(ctx context.Context) error {
	p.ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	p.origSrc = p.cfg.OrigSrc == nil || *p.cfg.OrigSrc
	specs := p.specs()
	p.mu.Lock()
	lns, listened := p.listeners, p.listened
	p.mu.Unlock()
	if !listened {
		var err error
		if p.cfg.Control != nil {
			cerr := p.cfg.Control(func() error { lns, err = p.listenAll(ctx); return nil })
			if cerr != nil {
				err = cerr
			}
		} else {
			lns, err = p.listenAll(ctx)
		}
		if err != nil {
			return fmt.Errorf("proxy %s: %w", p.cfg.Workload, err)
		}
	} else if lns == nil {
		return fmt.Errorf("proxy %s: closed after Listen", p.cfg.Workload)
	}
	p.mu.Lock()
	p.listeners, p.listened = lns, true
	p.mu.Unlock()
	p.watchCRL() // crl.go
	for i, s := range specs {
		if p.cfg.WatchListeners {
			wl, err := p.watchListener(lns[i], s.use, s.serve)
			if err == nil {
				p.mu.Lock()
				p.watched = append(p.watched, wl)
				p.mu.Unlock()
				continue
			}
			// The engine is closing: serve the way that needs none of it.
			p.log.Warn("listener not watched", "addr", lns[i].Addr().String(), "error", err)
		}
		p.wg.Add(1)
		go p.acceptLoop(lns[i], s.use, s.serve)
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
// Each accepted connection first takes use.units of the descriptor budget
// for its source IP (budget.go); a refused one is reset at once. The
// worker gives them back when serve did not hand the connection off, the
// relay's end (conn.releaseBudget) when it did.
//
// Connections are served by workers: goroutines that take the next
// accepted connection when they finish one and end after workerIdle
// without work, or when the listener closes. A worker's stack has already
// grown to what routing and dialing need; a goroutine per connection paid
// that growth (and its allocation) every time.
func (p *Proxy) acceptLoop(ln *net.TCPListener, use budgetUse, serve func(*net.TCPConn) bool) {
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
		if !p.accepted(c, use, serve, work) {
			return
		}
	}
}

// accepted admits c, accepted on a listener of use, and hands it to an
// idle worker on work or a new one (with work nil, to Config.Workers); it
// reports false when the proxy has closed (c is closed then).
func (p *Proxy) accepted(c *net.TCPConn, use budgetUse, serve func(*net.TCPConn) bool, work chan *net.TCPConn) bool {
	peer := addrPortOf(c.RemoteAddr()).Addr()
	if !p.admitBudget(use.listener, peer, use.units) {
		_ = c.SetLinger(0)
		c.Close()
		return true
	}
	if !p.track(c) {
		c.Close()
		p.cfg.Budget.Release(peer, use.units)
		return false
	}
	// No engine.Accepted: the listener's keepalive and TCP_NODELAY are
	// already the accepted socket's (engine.Listen).
	p.wg.Add(1) // the connection's; release ends it
	if work == nil {
		p.cfg.Workers.hand(job{p: p, c: c, units: use.units, serve: serve})
		return true
	}
	select {
	case work <- c: // an idle worker takes it
	default:
		p.wg.Add(1) // the worker's
		go p.worker(c, work, use.units, serve)
	}
	return true
}

// workerIdle is how long a connection worker waits for its next connection
// before it ends.
const workerIdle = 5 * time.Second

// worker serves c, then the connections it is handed on work, until work
// closes or none comes for workerIdle. Each took units of the budget.
func (p *Proxy) worker(c *net.TCPConn, work <-chan *net.TCPConn, units int, serve func(*net.TCPConn) bool) {
	defer p.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		p.serveOne(c, units, serve)
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

// serveOne serves c, which took units of the budget, on a worker.
func (p *Proxy) serveOne(c *net.TCPConn, units int, serve func(*net.TCPConn) bool) {
	if !serve(c) {
		// Before release: once the proxy's last connection is released,
		// its Drain returns with the budget given back.
		p.cfg.Budget.Release(addrPortOf(c.RemoteAddr()).Addr(), units)
		p.release(c)
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
	lns, watched := p.listeners, p.watched
	p.listeners, p.watched = nil, nil
	p.mu.Unlock()
	// Off the watcher before the listeners close (a closed descriptor's
	// number may be reused), and their idle workers ended.
	for _, wl := range watched {
		wl.stop()
	}
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
