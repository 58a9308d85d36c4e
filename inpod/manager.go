package inpod

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// SocketOpener is a Proxy that opens its sockets in the pod apart from
// Start (*proxy.Proxy does). The Manager then switches a thread into the
// pod's network namespace once per add: Listen runs there, together with
// the rest of what the add does inside (Config.MigrateRequests), and Start
// serves what it opened. A proxy without it opens its sockets in Start,
// through its control function, one switch per call of it.
//
// Listen runs on a thread inside the pod's namespace: it must create its
// sockets synchronously on the calling goroutine (inpod/netns.Run says
// why) and nothing that belongs in the daemon's namespace. On an error it
// has closed what it opened, and the error fails the add as Start's would;
// Close before Start closes what it opened.
type SocketOpener interface {
	Listen(ctx context.Context) error
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
