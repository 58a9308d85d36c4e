package inpod

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel/metrics"
)

// DefaultUDS is where Istio's CNI agent serves ZDS (INPOD_UDS).
const DefaultUDS = "/var/run/ztunnel/ztunnel.sock"

// ReadinessTask is the readiness task the Manager holds until the first
// snapshot is processed with no pod pending, and again while disconnected.
const ReadinessTask = "workload proxy manager"

// Pod states in WorkloadState, as ztunnel's /config_dump spells them.
const (
	StatePending = "Pending"
	StateUp      = "Up"
)

// Proxy is one pod's running proxy, as the Manager drives it.
// *proxy.Proxy satisfies it.
type Proxy interface {
	// Start opens the pod's listeners (inside its namespace) and serves.
	Start(ctx context.Context) error
	// Drain stops accepting at once and lets connections finish until ctx
	// is done, then closes the rest; it returns when the proxy has ended.
	Drain(ctx context.Context)
	// Close is Drain with no grace period.
	Close()
}

// Pod is what a proxy is built for: the pod's uid and workload info, and its
// network namespace, whose Run method is the control function that must
// wrap every socket the proxy creates (listen and dial).
type Pod struct {
	UID string
	WorkloadInfo
	// Netns stays owned by the Manager, open until the proxy has ended.
	Netns *Netns
}

// Config configures a Manager.
type Config struct {
	// UDS is the CNI agent's socket; "" means DefaultUDS.
	UDS string
	// NewProxy builds (without starting) the proxy of one pod. Required.
	NewProxy func(pod Pod) (Proxy, error)
	// Ready registers a readiness task and returns its done function
	// (admin.Readiness.Register); nil tracks no readiness.
	Ready func(task string) (done func())
	// Metrics receives the workload_manager_* figures; nil counts nothing.
	Metrics *metrics.Metrics
	// Logger receives the manager's events (scope "inpod"); nil discards.
	Logger *slog.Logger
	// RetryInterval is how often pods whose proxy failed to start are
	// retried; 0 means 5s (ztunnel's).
	RetryInterval time.Duration
	// MinBackoff and MaxBackoff bound the reconnect backoff, which doubles
	// from MinBackoff; 0 means 10ms and 15s (ztunnel's).
	MinBackoff, MaxBackoff time.Duration
	// WriteTimeout bounds sending one response; 0 means 10s. A CNI agent
	// that stops reading costs a reconnect, not a stuck manager.
	WriteTimeout time.Duration
	// MigrateRequests sets net.ipv4.tcp_migrate_req=1 in each pod's netns
	// (best effort, Linux 5.14+) before its proxy starts: when the old
	// daemon closes its SO_REUSEPORT listener, connections still queued
	// there move to the new daemon's. It is a second line only: where
	// /proc/sys is read-only (the chart's non-privileged container) the
	// write fails, and the engine's reuseport steering program
	// (engine/reuseport_linux.go) is what keeps an upgrade lossless, by
	// sending every new connection to the newest listener.
	MigrateRequests bool
}

// ProtocolError is a request that breaks the ZDS protocol: a Keep after the
// snapshot, a second SnapshotSent, an Add without workload info. ztunnel
// Nacks it, logs "protocol mismatch" and exits 1; the Manager Nacks it and
// stops with it (Err), and the daemon exits 1.
type ProtocolError struct {
	Reason string
}

// Error says what broke the protocol.
func (e *ProtocolError) Error() string { return "inpod: protocol mismatch: " + e.Reason }

// proxyError is a pod whose proxy failed to start: Nacked, kept pending and
// retried, with the stream kept up.
type proxyError struct {
	uid string
	err error
}

func (e *proxyError) Error() string {
	return fmt.Sprintf("failure to start proxy for %s: %v", e.uid, e.err)
}
func (e *proxyError) Unwrap() error { return e.err }

// announceError is a failed hello: retried with backoff, like a failed
// connect.
type announceError struct{ err error }

func (e *announceError) Error() string { return "inpod: announce to the CNI agent: " + e.err.Error() }
func (e *announceError) Unwrap() error { return e.err }

// WorkloadState is one pod as /config_dump shows it under "workloadState".
type WorkloadState struct {
	Info  WorkloadInfo
	State string // StatePending or StateUp
	// Proxy is the pod's running proxy when Up (for its connections in the
	// dump); nil while Pending.
	Proxy Proxy
}

type podProxy struct {
	info  WorkloadInfo
	netns *Netns
	proxy Proxy
	gen   uint64
}

type pendingPod struct {
	info  WorkloadInfo
	netns *Netns
	gen   uint64
}

type stateEntry struct {
	WorkloadState
	gen uint64
}

// Manager is the ZDS client and the owner of every pod's proxy. One
// goroutine (started by Start) owns the stream and the pod tables; other
// goroutines only read WorkloadState and call Drain or Close.
type Manager struct {
	cfg Config
	log *slog.Logger

	home *Netns // the daemon's own netns, where Run returns threads

	ctx    context.Context // ends the stream loop
	cancel context.CancelFunc
	done   chan struct{} // closed when the loop has ended
	err    error         // the loop's fatal error; read after done

	// Owned by the loop goroutine, and by Drain once the loop has ended.
	proxies    map[string]*podProxy
	pending    map[string]*pendingPod
	seen       map[string]struct{} // uids replayed since the last connect
	snapshot   bool                // SnapshotSent processed on this stream
	retryAt    time.Time           // zero: no retry scheduled
	blockReady func()              // non-nil while the readiness task is held
	nextGen    uint64

	closing sync.WaitGroup // proxies closing in the background (Del, replace, reconcile)

	startOnce, drainOnce sync.Once

	stateMu sync.Mutex // guards states
	states  map[string]*stateEntry
}

// New validates cfg and returns a Manager that holds the readiness task but
// has not connected yet.
func New(cfg Config) (*Manager, error) {
	if cfg.NewProxy == nil {
		return nil, errors.New("inpod: Config.NewProxy is required")
	}
	if cfg.UDS == "" {
		cfg.UDS = DefaultUDS
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = 5 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 10 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 15 * time.Second
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Every unlocked thread is in the daemon's namespace (Netns.Run keeps
	// it so), so the current thread's is the daemon's.
	home, err := OpenNetns("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:     cfg,
		home:    home,
		log:     log.With("scope", "inpod"),
		done:    make(chan struct{}),
		proxies: map[string]*podProxy{},
		pending: map[string]*pendingPod{},
		seen:    map[string]struct{}{},
		states:  map[string]*stateEntry{},
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.notReady()
	return m, nil
}

// Start connects to the CNI agent and serves it until Drain, Close or a
// protocol error. It returns at once; calling it again does nothing.
func (m *Manager) Start() {
	m.startOnce.Do(func() { go m.run() })
}

// Done is closed when the manager has stopped serving the CNI agent: after
// Drain or Close, or on a protocol error (see Err).
func (m *Manager) Done() <-chan struct{} { return m.done }

// Err returns, once Done is closed, the *ProtocolError that stopped the
// manager, or nil when it was drained or closed.
func (m *Manager) Err() error {
	select {
	case <-m.done:
		return m.err
	default:
		return nil
	}
}

// Drain stops serving the CNI agent, then drains every pod's proxy in
// parallel: listeners close at once, connections may finish until ctx is
// done, the rest are closed. It returns when every proxy has ended.
// Calls after the first wait for it and do nothing more.
func (m *Manager) Drain(ctx context.Context) {
	m.drainOnce.Do(func() {
		m.cancel()
		// Never started: nothing else will close done, and Start must not
		// start the loop any more.
		m.startOnce.Do(func() { close(m.done) })
		<-m.done
		var wg sync.WaitGroup
		for uid, p := range m.proxies {
			delete(m.proxies, uid)
			wg.Go(func() {
				p.proxy.Drain(ctx)
				m.proxyEnded(uid, p)
			})
		}
		wg.Wait()
		m.closing.Wait()
		for uid := range m.pending {
			m.dropPending(uid)
		}
		m.updateCounts()
		m.home.Close() // no proxy is left to enter a pod
		m.log.Info("workload proxy manager drained")
	})
}

// Close is Drain with no grace period.
func (m *Manager) Close() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m.Drain(ctx)
}

// WorkloadState returns every known pod by uid (/config_dump
// "workloadState"). Safe for concurrent use.
func (m *Manager) WorkloadState() map[string]WorkloadState {
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	out := make(map[string]WorkloadState, len(m.states))
	for uid, e := range m.states {
		out[uid] = e.WorkloadState
	}
	return out
}

func (m *Manager) setState(uid string, info WorkloadInfo, state string, p Proxy, gen uint64) {
	m.stateMu.Lock()
	m.states[uid] = &stateEntry{WorkloadState{Info: info, State: state, Proxy: p}, gen}
	m.stateMu.Unlock()
}

// clearState forgets uid unless a newer proxy (another generation) took it.
func (m *Manager) clearState(uid string, gen uint64) {
	m.stateMu.Lock()
	if e, ok := m.states[uid]; ok && e.gen == gen {
		delete(m.states, uid)
	}
	m.stateMu.Unlock()
}

// run is the owner loop: connect, serve the stream, reconnect with backoff.
func (m *Manager) run() {
	defer close(m.done)
	backoff := m.cfg.MinBackoff
	for {
		conn, err := m.connect(&backoff)
		if err != nil {
			return // drained while connecting
		}
		progressed, err := m.serve(conn)
		conn.Close()
		m.notReady()
		if pe := (*ProtocolError)(nil); errors.As(err, &pe) {
			m.log.Error("protocol mismatch error while processing stream, shutting down", "error", err)
			m.err = err
			return
		}
		if m.ctx.Err() != nil {
			return
		}
		if err == nil {
			m.log.Info("ZDS stream ended by the CNI agent, reconnecting")
		} else {
			m.log.Warn("ZDS stream ended, reconnecting", "error", err)
		}
		if progressed {
			backoff = m.cfg.MinBackoff
			continue
		}
		// Nothing was exchanged: the agent may be restarting or may not
		// speak our protocol. Do not spin on it.
		if !m.sleep(backoff) {
			return
		}
		backoff = min(backoff*2, m.cfg.MaxBackoff)
	}
}

// connect dials the agent's socket until it answers or the manager drains.
func (m *Manager) connect(backoff *time.Duration) (*net.UnixConn, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(m.ctx, "unixpacket", m.cfg.UDS)
		if err == nil {
			m.log.Info("connected to the CNI agent", "uds", m.cfg.UDS)
			return c.(*net.UnixConn), nil
		}
		if m.ctx.Err() != nil {
			return nil, m.ctx.Err()
		}
		*backoff = min(*backoff*2, m.cfg.MaxBackoff)
		m.log.Warn("failed to connect to the Istio CNI node agent, is the node agent healthy?",
			"uds", m.cfg.UDS, "error", err, "retry_in", backoff.String())
		if !m.sleep(*backoff) {
			return nil, m.ctx.Err()
		}
	}
}

func (m *Manager) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-m.ctx.Done():
		return false
	}
}

// serve runs one stream: hello, then one response per request, retrying
// pending pods when their timer fires. progressed reports whether any
// request was processed. A nil error is a clean end of stream (or drain).
func (m *Manager) serve(conn *net.UnixConn) (progressed bool, err error) {
	m.resetSnapshot()
	stop := context.AfterFunc(m.ctx, func() { conn.Close() })
	defer stop()
	if err := m.send(conn, helloPacket()); err != nil {
		return false, &announceError{err}
	}
	buf, oob := make([]byte, maxPacket), make([]byte, oobSpace)
	for {
		// The pending retry rides on the read deadline: the loop stays the
		// only owner, and a deadline that fires consumes no packet.
		if err := conn.SetReadDeadline(m.retryAt); err != nil {
			return progressed, err
		}
		req, err := readRequest(conn, buf, oob)
		if err != nil {
			switch {
			case m.ctx.Err() != nil:
				return progressed, nil
			case errors.Is(err, os.ErrDeadlineExceeded):
				m.retryPending()
				continue
			case errors.Is(err, io.EOF):
				return progressed, nil
			}
			m.log.Error("failed to read message", "error", err)
			if serr := m.send(conn, ackPacket("failure to read message: "+err.Error())); serr != nil {
				return progressed, errors.Join(err, serr)
			}
			// Undecodable: reconnect, as ztunnel does. Proxies keep serving
			// and the agent's replay re-syncs us.
			return progressed, err
		}
		progressed = true
		herr := m.handle(req)
		var pe *proxyError
		switch {
		case herr == nil:
			m.checkReady()
			err = m.send(conn, ackPacket(""))
		case errors.As(herr, &pe):
			m.log.Error("failed to start proxy", "uid", pe.uid, "error", pe.err)
			m.scheduleRetry()
			m.checkReady()
			err = m.send(conn, ackPacket(herr.Error()))
		default:
			m.log.Error("failed to process message", "request", req.kind.String(), "uid", req.uid, "error", herr)
			_ = m.send(conn, ackPacket("failure to process message: "+herr.Error()))
			return progressed, herr
		}
		if err != nil {
			return progressed, err
		}
	}
}

func (m *Manager) send(conn *net.UnixConn, b []byte) error {
	if err := conn.SetWriteDeadline(time.Now().Add(m.cfg.WriteTimeout)); err != nil {
		return err
	}
	_, err := conn.Write(b)
	return err
}

// handle applies one request to the pod tables.
func (m *Manager) handle(req request) error {
	switch req.kind {
	case kindAdd:
		info := WorkloadInfo{}
		if req.info != nil {
			info = *req.info
		}
		m.log.Info("pod received, starting proxy", "uid", req.uid, "name", info.Name, "namespace", info.Namespace)
		if req.info == nil {
			req.netns.Close()
			return &ProtocolError{Reason: "workload_info is required but not present"}
		}
		if !m.snapshot {
			m.seen[req.uid] = struct{}{}
		}
		req.netns.home = m.home.fd
		return m.addWorkload(req.uid, info, req.netns)
	case kindKeep:
		m.log.Info("pod keep received, will not delete it when the snapshot is sent", "uid", req.uid)
		if m.snapshot {
			return &ProtocolError{Reason: "pod keep received after snapshot"}
		}
		m.seen[req.uid] = struct{}{}
		return nil
	case kindDel:
		m.log.Info("pod delete request, shutting down proxy", "uid", req.uid)
		if !m.snapshot {
			// The snapshot's reconcile stops a running proxy; a pending one
			// it cannot see, so drop that here.
			delete(m.seen, req.uid)
			m.dropPending(req.uid)
			m.updateCounts()
			return nil
		}
		m.dropPending(req.uid)
		m.stopWorkload(req.uid)
		m.updateCounts()
		return nil
	case kindSnapshot:
		m.log.Info("received snapshot sent")
		if m.snapshot {
			return &ProtocolError{Reason: "pod snapshot received already"}
		}
		m.reconcile()
		m.snapshot = true
		return nil
	}
	return fmt.Errorf("inpod: unhandled request %v", req.kind)
}

// addWorkload starts uid's proxy, or keeps it pending when that fails.
// It owns ns from here on.
func (m *Manager) addWorkload(uid string, info WorkloadInfo, ns *Netns) error {
	if err := m.startWorkload(uid, info, ns); err != nil {
		m.dropPending(uid)
		m.pending[uid] = &pendingPod{info: info, netns: ns, gen: m.nextGen}
		m.updateCounts()
		return &proxyError{uid: uid, err: err}
	}
	m.dropPending(uid)
	m.updateCounts()
	return nil
}

func (m *Manager) startWorkload(uid string, info WorkloadInfo, ns *Netns) error {
	if cur, ok := m.proxies[uid]; ok {
		if cur.netns.ID() == ns.ID() {
			// The same pod again (a replay): nothing to do.
			if cur.netns != ns {
				ns.Close()
			}
			return nil
		}
		// A new sandbox for the same pod: replace its proxy.
		m.log.Info("pod netns changed, replacing its proxy", "uid", uid, "old", cur.netns.ID().String(), "new", ns.ID().String())
		m.stopWorkload(uid)
	}
	m.nextGen++
	gen := m.nextGen
	m.setState(uid, info, StatePending, nil, gen)
	if m.cfg.MigrateRequests {
		if err := ns.Run(enableMigrateReq); err != nil {
			// Expected with a read-only /proc/sys; the reuseport steering
			// program covers upgrades without it.
			m.log.Info("cannot set net.ipv4.tcp_migrate_req in the pod; upgrades rely on the reuseport steering program", "uid", uid, "error", err)
		}
	}
	p, err := m.cfg.NewProxy(Pod{UID: uid, WorkloadInfo: info, Netns: ns})
	if err != nil {
		return err
	}
	if err := p.Start(m.ctx); err != nil {
		return err
	}
	m.proxies[uid] = &podProxy{info: info, netns: ns, proxy: p, gen: gen}
	m.setState(uid, info, StateUp, p, gen)
	m.cfg.Metrics.ProxyStarted()
	m.log.Info("pod proxy up", "uid", uid, "name", info.Name, "namespace", info.Namespace, "netns", ns.ID().String())
	return nil
}

// enableMigrateReq runs inside a pod's netns: /proc/sys/net resolves to the
// network namespace of the calling thread.
func enableMigrateReq() error {
	return os.WriteFile("/proc/sys/net/ipv4/tcp_migrate_req", []byte("1"), 0)
}

// stopWorkload closes uid's proxy at once, in the background so the stream
// is answered without waiting; Drain waits for it.
func (m *Manager) stopWorkload(uid string) {
	p, ok := m.proxies[uid]
	if !ok {
		return
	}
	delete(m.proxies, uid)
	// The pod leaves /config_dump now, not once its proxy has closed: an
	// acknowledged Del means the pod is gone (and a test or operator reading
	// the state right after the ack must not see it).
	m.clearState(uid, p.gen)
	m.closing.Go(func() {
		p.proxy.Close()
		m.proxyEnded(uid, p)
	})
}

// proxyEnded releases what a finished proxy held.
func (m *Manager) proxyEnded(uid string, p *podProxy) {
	p.netns.Close()
	m.clearState(uid, p.gen)
	m.cfg.Metrics.ProxyStopped()
	m.log.Info("pod proxy stopped", "uid", uid, "name", p.info.Name, "namespace", p.info.Namespace)
}

func (m *Manager) dropPending(uid string) {
	if pp, ok := m.pending[uid]; ok {
		delete(m.pending, uid)
		pp.netns.Close()
		m.clearState(uid, pp.gen)
	}
}

// reconcile stops every proxy the snapshot did not mention: pods deleted
// while we were not connected.
func (m *Manager) reconcile() {
	for uid := range m.proxies {
		if _, ok := m.seen[uid]; !ok {
			m.log.Info("pod not in the snapshot, shutting down its proxy", "uid", uid)
			m.stopWorkload(uid)
		}
	}
	clear(m.seen)
	m.updateCounts()
}

// resetSnapshot starts a new stream: the agent replays everything.
func (m *Manager) resetSnapshot() {
	clear(m.seen)
	for uid := range m.pending {
		m.dropPending(uid)
	}
	m.snapshot = false
	m.retryAt = time.Time{}
	m.updateCounts()
}

func (m *Manager) scheduleRetry() {
	if m.retryAt.IsZero() {
		m.retryAt = time.Now().Add(m.cfg.RetryInterval)
	}
}

// retryPending tries every pending pod again.
func (m *Manager) retryPending() {
	m.retryAt = time.Time{}
	todo := m.pending
	m.pending = map[string]*pendingPod{}
	for uid, pp := range todo {
		m.log.Info("retrying pod", "uid", uid)
		if err := m.addWorkload(uid, pp.info, pp.netns); err != nil {
			m.log.Info("retrying pod failed", "uid", uid, "error", err)
		}
	}
	if len(m.pending) > 0 {
		m.scheduleRetry()
	}
	m.checkReady()
}

func (m *Manager) checkReady() {
	if m.snapshot && len(m.pending) == 0 {
		if m.blockReady != nil {
			m.log.Debug("workload proxy manager is ready")
			m.blockReady()
			m.blockReady = nil
		}
		return
	}
	m.notReady()
}

func (m *Manager) notReady() {
	if m.blockReady == nil && m.cfg.Ready != nil {
		m.blockReady = m.cfg.Ready(ReadinessTask)
	}
}

func (m *Manager) updateCounts() {
	m.cfg.Metrics.SetActiveProxies(len(m.proxies))
	m.cfg.Metrics.SetPendingProxies(len(m.pending))
}
