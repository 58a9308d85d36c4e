package engine

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

// Backend names, as Config.Backend, ZTUNNEL_ENGINE and Engine.Backend spell
// them.
const (
	// BackendAuto picks the best backend the kernel allows, in the order
	// of measured performance (see autoOrder): today epoll, then io_uring.
	BackendAuto = "auto"
	// BackendStd relays with a goroutine per direction (io.Copy): the
	// portable baseline, kept for comparison.
	BackendStd = "std"
	// BackendEpoll runs relays in epoll event loops, one per core.
	BackendEpoll = "epoll"
	// BackendUring runs relays in io_uring event loops, one per core.
	BackendUring = "uring"
)

// EnvBackend is the environment variable that overrides the backend of an
// Engine whose Config.Backend is empty: "std", "epoll", "uring" or "auto".
// An unknown value is an error from New; a backend the kernel refuses falls
// back to auto (the fallback is logged and Backend reports what runs).
const EnvBackend = "ZTUNNEL_ENGINE"

var (
	// ErrClosed ends relays still running when their Engine is closed, and
	// relays handed to an Engine that is already closed.
	ErrClosed = errors.New("engine: closed")
	// ErrIdleTimeout ends a relay that moved no byte for Config.IdleTimeout.
	ErrIdleTimeout = errors.New("engine: relay idle timeout")
	// ErrAborted ends a relay aborted through its Handle with no cause.
	ErrAborted = errors.New("engine: relay aborted")
)

// Config configures an Engine. The zero value is usable: auto backend (or
// ZTUNNEL_ENGINE), one loop per GOMAXPROCS, 1 MiB pipes, no idle timeout.
type Config struct {
	// Backend is one of the Backend* names; "" reads EnvBackend, and when
	// that is unset means BackendAuto. A backend named here that the kernel
	// refuses is an error from New.
	Backend string
	// Loops is the number of event loops; 0 means runtime.GOMAXPROCS(0).
	// The epoll backend has this many for TCP⇄TCP relays and as many again
	// for TCP⇄stream relays.
	Loops int
	// PipeSize is the capacity asked of each relay pipe; 0 means 1 MiB.
	PipeSize int
	// MaxFreePipes bounds the empty pipes each loop keeps for reuse; 0 means
	// 64, negative keeps none.
	MaxFreePipes int
	// IdleTimeout aborts a relay (with RST both ways and ErrIdleTimeout)
	// that moved no byte for this long; 0 disables it, as ztunnel has none
	// and relies on TCP keepalive. The check runs in the event loops; the
	// std backend ignores it.
	IdleTimeout time.Duration
	// Linger is how long a loop with no relay keeps its OS thread before
	// parking (its goroutine ends; the next relay starts it again); 0 means
	// 100ms.
	Linger time.Duration
	// LockOSThread runs each event loop on a locked OS thread blocked in
	// epoll_wait. Without it the epoll backend's TCP⇄TCP loops block their
	// goroutine in epoll_wait (thread not locked) and its TCP⇄stream loops
	// park in the runtime's netpoller, each the faster way for its kind.
	LockOSThread bool
	// Logf, if set, receives the engine's rare notes (backend choice,
	// fallbacks). Nil discards them.
	Logf func(format string, args ...any)
}

// Engine runs relays. It is safe for concurrent use.
type Engine struct {
	cfg     Config
	name    string
	backend backend // nil for BackendStd

	mu        sync.Mutex // guards the following fields
	idle      sync.Cond  // signalled when active or callbacks drops to zero
	closed    bool
	active    int             // relays started and not yet ended
	callbacks int             // done functions running
	drained   []chan struct{} // closed when active drops to zero
	stdLive   map[*stdRelay]struct{}

	// detachFault, set by tests before any relay starts, makes handOff's
	// takeover of a socket fail with the error it returns for that conn.
	detachFault func(*net.TCPConn) error
}

// backend is the seam between an Engine and one way of running TCP⇄TCP
// relays in event loops (epoll_linux.go, uring_linux.go). Pairs that are not
// TCP to TCP always take the goroutine relay.
type backend interface {
	// relayTCP takes ownership of two connected, non-blocking TCP sockets
	// and relays between them; it ends s exactly once.
	relayTCP(fa, fb int, s *session)
	// close aborts every relay with ErrClosed, stops the loops and returns
	// once they have stopped.
	close()
	// stats adds the backend's figures to st.
	stats(st *Stats)
}

// streamBackend is a backend that also runs TCP⇄stream relays in its loops
// (epoll); the others leave them to the goroutine relay.
type streamBackend interface {
	// relayStream takes ownership of a connected, non-blocking TCP socket
	// on side tcpSide (0 A, 1 B) and of st on the other side, and relays
	// between them; it ends s exactly once.
	relayStream(fd, tcpSide int, st StreamEndpoint, s *session)
}

// streamPair reports whether a and b are a TCP socket and a stream a
// stream backend can take, and which side the socket is on.
func (e *Engine) streamPair(a, b Endpoint) (TCPEndpoint, StreamEndpoint, int, bool) {
	if _, ok := e.backend.(streamBackend); !ok {
		return TCPEndpoint{}, nil, 0, false
	}
	if t, ok := a.(TCPEndpoint); ok {
		if st, ok := b.(StreamEndpoint); ok {
			return t, st, 0, true
		}
	}
	if t, ok := b.(TCPEndpoint); ok {
		if st, ok := a.(StreamEndpoint); ok {
			return t, st, 1, true
		}
	}
	return TCPEndpoint{}, nil, 0, false
}

// handOffStream takes the socket from its *net.TCPConn and gives it, with
// the stream, to the backend.
func (e *Engine) handOffStream(t TCPEndpoint, st StreamEndpoint, tcpSide int, s *session) {
	if !s.byHandle {
		s.tcp = [2]weak.Pointer[net.TCPConn]{weak.Make(t.TCPConn)}
		handedOff.add(s.tcp[0], s)
	}
	fd, err := detach(t.TCPConn)
	if err != nil {
		if !s.byHandle {
			handedOff.remove(s.tcp[0])
		}
		_ = t.Abort()
		_ = st.Abort()
		_ = st.Close()
		s.finish(fmt.Errorf("engine: take over socket: %w", err))
		return
	}
	e.backend.(streamBackend).relayStream(fd, tcpSide, st, s)
}

// New starts an Engine. Its loops start with the first relay, so an Engine
// with no relay holds no thread.
func New(cfg Config) (*Engine, error) {
	if cfg.Loops <= 0 {
		cfg.Loops = runtime.GOMAXPROCS(0)
	}
	if cfg.Linger <= 0 {
		cfg.Linger = 100 * time.Millisecond
	}
	want, fromEnv := cfg.Backend, false
	if want == "" {
		want, fromEnv = strings.TrimSpace(os.Getenv(EnvBackend)), true
	}
	if want == "" {
		want = BackendAuto
	}
	e := &Engine{cfg: cfg}
	e.idle.L = &e.mu
	switch want {
	case BackendStd:
		e.name = BackendStd
		return e, nil
	case BackendEpoll, BackendUring:
		b, err := newBackend(want, e)
		if err == nil {
			e.name, e.backend = want, b
			return e, nil
		}
		if !fromEnv {
			return nil, err
		}
		e.logf("engine: %s=%s unavailable (%v); choosing automatically", EnvBackend, want, err)
	case BackendAuto:
	default:
		if fromEnv {
			return nil, fmt.Errorf("engine: %s=%q: unknown backend (want std, epoll, uring or auto)", EnvBackend, want)
		}
		return nil, fmt.Errorf("engine: unknown backend %q (want std, epoll, uring or auto)", want)
	}
	var errs []error
	for _, name := range autoOrder {
		b, err := newBackend(name, e)
		if err == nil {
			e.name, e.backend = name, b
			e.logf("engine: backend %s", name)
			return e, nil
		}
		errs = append(errs, err)
	}
	e.logf("engine: no event-loop backend (%v); relaying with goroutines", errors.Join(errs...))
	e.name = BackendStd
	return e, nil
}

// autoOrder is the preference of BackendAuto. Measured on a 2-core VM
// (bench_test.go, one run side by side) the epoll loops beat the io_uring
// ones on throughput, latency and connection rate: every io_uring splice
// runs in an io-wq worker, and a loop that must own its thread pays the
// scheduler's locked-thread handoff on every wake-up. So auto prefers
// epoll, and io_uring serves where it is asked for (and as the fallback
// should epoll ever be missing); flip the order where measurements say
// io_uring wins.
var autoOrder = []string{BackendEpoll, BackendUring}

// newBackend builds the named event-loop backend, or says why the kernel
// refuses it.
func newBackend(name string, e *Engine) (backend, error) {
	switch name {
	case BackendEpoll:
		return newEpollBackend(e)
	case BackendUring:
		return newUringBackend(e)
	}
	return nil, fmt.Errorf("engine: unknown backend %q", name)
}

func (e *Engine) logf(format string, args ...any) {
	if e.cfg.Logf != nil {
		e.cfg.Logf(format, args...)
	}
}

// Backend names the backend that runs this engine's TCP⇄TCP relays (one of
// the Backend* names other than auto), for logs and /config_dump.
func (e *Engine) Backend() string { return e.name }

var defaultEngine struct {
	once sync.Once
	e    *Engine
}

// Default returns the process's shared engine, built on first use from
// Config{} (so ZTUNNEL_ENGINE applies). An invalid ZTUNNEL_ENGINE makes it
// fall back to auto. Its loops park when they have no relay, so it holds no
// thread or goroutine while unused. The package never closes it; the daemon
// may Drain it at shutdown (relays handed over afterwards are refused).
func Default() *Engine {
	defaultEngine.once.Do(func() {
		e, err := New(Config{})
		if err != nil {
			e, _ = New(Config{Backend: BackendAuto})
		}
		defaultEngine.e = e
	})
	return defaultEngine.e
}

// BackendName names the default engine's backend.
func BackendName() string { return Default().Backend() }

// Relay moves bytes both ways between a and b until both directions end,
// propagating half-close and resets, updating counters as bytes move, and
// closes both endpoints before it returns. The calling goroutine waits; see
// Start for the form that does not hold it.
func (e *Engine) Relay(a, b Endpoint, counters *Counters) Result {
	if counters == nil {
		counters = new(Counters)
	}
	ta, okA := a.(TCPEndpoint)
	tb, okB := b.(TCPEndpoint)
	if t, st, side, ok := e.streamPair(a, b); ok {
		ch := make(chan Result, 1)
		s, ok := e.begin(counters, nil, ch)
		if !ok {
			return e.refuse(a, b, s)
		}
		e.handOffStream(t, st, side, s)
		return <-ch
	}
	if e.backend == nil || !okA || !okB {
		// The goroutine relay runs on the caller's goroutine: no handoff.
		s, ok := e.begin(counters, nil, nil)
		if !ok {
			return e.refuse(a, b, s)
		}
		r := &stdRelay{a: a, b: b}
		if !e.trackStd(r, s) {
			return Result{Err: ErrClosed}
		}
		err := r.run(counters)
		e.untrackStd(r)
		s.finish(err)
		return Result{Err: err}
	}
	ch := make(chan Result, 1)
	s, ok := e.begin(counters, nil, ch)
	if !ok {
		return e.refuse(a, b, s)
	}
	e.handOff(ta, tb, s)
	return <-ch
}

// Start hands a relay between a and b to the engine and returns at once.
// Between two TCPEndpoints on an event-loop backend the relay holds no
// goroutine: the engine takes over both sockets (the *net.TCPConns are
// closed at once; use nothing of them afterwards). Other pairs run on two
// goroutines owned by the engine.
//
// done, if not nil, is called once with the result after both endpoints are
// closed, on a goroutine of its own (it may block; Close waits for it).
// counters, if not nil, moves as bytes flow.
func (e *Engine) Start(a, b Endpoint, counters *Counters, done func(Result)) *Handle {
	return e.start(a, b, counters, done, false)
}

// StartByHandle is Start for a caller that resets the relay only through the
// returned Handle: TCPEndpoint.Abort on an endpoint handed to an event loop
// then no longer reaches the relay (the *net.TCPConn is closed; Abort does
// nothing), and the engine keeps no record per socket for that lookup
// (~50 B per socket, which an idle relay would hold for its life).
func (e *Engine) StartByHandle(a, b Endpoint, counters *Counters, done func(Result)) *Handle {
	return e.start(a, b, counters, done, true)
}

func (e *Engine) start(a, b Endpoint, counters *Counters, done func(Result), byHandle bool) *Handle {
	if counters == nil {
		counters = new(Counters)
	}
	s, ok := e.begin(counters, done, nil)
	s.byHandle = byHandle
	if !ok {
		e.refuse(a, b, s)
		return s.handle()
	}
	ta, okA := a.(TCPEndpoint)
	tb, okB := b.(TCPEndpoint)
	if e.backend != nil && okA && okB {
		e.handOff(ta, tb, s)
		return s.handle()
	}
	if t, st, side, ok := e.streamPair(a, b); ok {
		e.handOffStream(t, st, side, s)
		return s.handle()
	}
	r := &stdRelay{a: a, b: b}
	if !e.trackStd(r, s) {
		return s.handle()
	}
	go func() {
		err := r.run(counters)
		e.untrackStd(r)
		s.finish(err)
	}()
	return s.handle()
}

// handOff takes the sockets from their *net.TCPConns and gives them to the
// backend.
func (e *Engine) handOff(a, b TCPEndpoint, s *session) {
	// Registered before the conns close, so an Abort racing with the
	// handoff is not lost (session.abort keeps it for the owner).
	if !s.byHandle {
		s.tcp = [2]weak.Pointer[net.TCPConn]{weak.Make(a.TCPConn), weak.Make(b.TCPConn)}
		handedOff.add(s.tcp[0], s)
		handedOff.add(s.tcp[1], s)
	}
	// A failed takeover resets the conns directly: TCPEndpoint.Abort would
	// find the session registered above and leave the abort pending for an
	// owner that never comes.
	fa, err := e.detach(a.TCPConn)
	if err != nil {
		resetConn(a.TCPConn)
		resetConn(b.TCPConn)
		s.finish(fmt.Errorf("engine: take over socket: %w", err))
		return
	}
	fb, err := e.detach(b.TCPConn)
	if err != nil {
		abortFD(fa)
		resetConn(b.TCPConn)
		s.finish(fmt.Errorf("engine: take over socket: %w", err))
		return
	}
	e.backend.relayTCP(fa, fb, s)
}

// detach is the package's detach, failing where a test asked it to.
func (e *Engine) detach(c *net.TCPConn) (int, error) {
	if e.detachFault != nil {
		if err := e.detachFault(c); err != nil {
			return -1, err
		}
	}
	return detach(c)
}

// begin registers a relay with the engine; false means the engine is
// closed.
func (e *Engine) begin(c *Counters, done func(Result), ch chan Result) (*session, bool) {
	s := &session{e: e, counters: c, done: done, ch: ch}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return s, false
	}
	e.active++
	return s, true
}

// refuse ends a relay handed to a closed engine: both ends are reset.
func (e *Engine) refuse(a, b Endpoint, s *session) Result {
	_ = a.Abort()
	_ = b.Abort()
	s.deliver(Result{Err: ErrClosed})
	return Result{Err: ErrClosed}
}

// trackStd records a goroutine relay so Close can abort it; false means
// the engine closed meanwhile (the relay is then ended).
func (e *Engine) trackStd(r *stdRelay, s *session) bool {
	s.setOwner(r)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		r.abort(ErrClosed)
		_ = r.a.Close()
		_ = r.b.Close()
		s.finish(ErrClosed)
		return false
	}
	if e.stdLive == nil {
		e.stdLive = make(map[*stdRelay]struct{})
	}
	e.stdLive[r] = struct{}{}
	e.mu.Unlock()
	return true
}

func (e *Engine) untrackStd(r *stdRelay) {
	e.mu.Lock()
	delete(e.stdLive, r)
	e.mu.Unlock()
}

// ended is called once per begun relay when it ends.
func (e *Engine) ended() {
	e.mu.Lock()
	e.active--
	if e.active == 0 {
		for _, ch := range e.drained {
			close(ch)
		}
		e.drained = nil
		e.idle.Broadcast()
	}
	e.mu.Unlock()
}

// callback runs done on a goroutine that Close waits for.
func (e *Engine) callback(done func(Result), res Result) {
	e.mu.Lock()
	e.callbacks++
	e.mu.Unlock()
	go func() {
		done(res)
		e.mu.Lock()
		e.callbacks--
		if e.callbacks == 0 {
			e.idle.Broadcast()
		}
		e.mu.Unlock()
	}()
}

// Drain waits until every relay has ended or ctx is done, then closes the
// engine (aborting what is left with ErrClosed). New relays are still
// accepted while it waits: stop the listeners first.
func (e *Engine) Drain(ctx context.Context) error {
	e.mu.Lock()
	var ch chan struct{}
	if e.active > 0 && !e.closed {
		ch = make(chan struct{})
		e.drained = append(e.drained, ch)
	}
	e.mu.Unlock()
	var err error
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
	}
	if cerr := e.Close(); cerr != nil && !errors.Is(cerr, ErrClosed) {
		return cerr
	}
	return err
}

// Close aborts every relay with ErrClosed (RST to both peers), stops the
// loops and waits for them and for the done callbacks. Relays handed over
// afterwards are refused. It is idempotent; a second call returns ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.closed = true
	live := make([]*stdRelay, 0, len(e.stdLive))
	for r := range e.stdLive {
		live = append(live, r)
	}
	e.mu.Unlock()
	for _, r := range live {
		r.abort(ErrClosed)
	}
	if e.backend != nil {
		e.backend.close()
	}
	// Goroutine relays end soon after their abort; wait for them and for
	// the done functions.
	e.mu.Lock()
	for e.active > 0 || e.callbacks > 0 {
		e.idle.Wait()
	}
	e.mu.Unlock()
	return nil
}

// Stats is a snapshot of an engine's load.
type Stats struct {
	// Backend is Engine.Backend.
	Backend string
	// Loops is the number of event loops for TCP⇄TCP relays (0 for std),
	// StreamLoops the number for TCP⇄stream relays (epoll only; the other
	// backends relay streams with goroutines) and Running how many loops of
	// either kind run right now.
	Loops, StreamLoops, Running int
	// Relays counts relays started and not yet ended, on any path.
	Relays int
	// LoopRelays counts the relays held by event loops.
	LoopRelays int
	// PipesInUse counts pipes holding in-flight data; PipesFree the empty
	// pipes pooled for reuse.
	PipesInUse, PipesFree int
	// StreamBuffers counts the buffers TCP⇄stream relays hold for bytes in
	// flight (none while idle).
	StreamBuffers int
}

// Stats reports the engine's current load.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	st := Stats{Backend: e.name, Relays: e.active}
	e.mu.Unlock()
	if e.backend != nil {
		e.backend.stats(&st)
	}
	return st
}

// aborter ends a running relay from outside its owner.
type aborter interface{ abort(cause error) }

// session is the engine's record of one relay, whatever runs it. An idle
// relay holds one: 80 bytes, a size class (TestRelaySizeClass).
type session struct {
	e        *Engine
	counters *Counters
	done     func(Result)
	ch       chan Result
	finished atomic.Bool
	byHandle bool                         // StartByHandle: tcp stays unset
	tcp      [2]weak.Pointer[net.TCPConn] // registered in handedOff while a loop owns them

	mu sync.Mutex // guards owner
	// owner is what runs the relay, once it runs; before that, a
	// *pendingAbort holds an abort that came first.
	owner aborter
}

// pendingAbort is a session's owner until the real one is set: the cause of
// an abort that came first (rare: a room of its own only then).
type pendingAbort struct{ cause error }

func (*pendingAbort) abort(error) {} // the first cause stands

// setOwner records what runs the relay and passes on an abort that
// arrived first. Backends call it after queueing the relay, so the abort
// reaches the owner after the relay itself.
func (s *session) setOwner(o aborter) {
	s.mu.Lock()
	prev := s.owner
	s.owner = o
	s.mu.Unlock()
	if p, ok := prev.(*pendingAbort); ok {
		o.abort(p.cause)
	}
}

// abort ends the relay with cause, now or as soon as it has an owner.
func (s *session) abort(cause error) {
	if s.finished.Load() {
		return
	}
	s.mu.Lock()
	o := s.owner
	if o == nil {
		s.owner = &pendingAbort{cause}
	}
	s.mu.Unlock()
	if o != nil {
		o.abort(cause)
	}
}

// finish reports the result once the relay has closed both endpoints.
func (s *session) finish(err error) {
	if s.finished.Swap(true) {
		return
	}
	for _, c := range s.tcp {
		if c != (weak.Pointer[net.TCPConn]{}) {
			handedOff.remove(c)
		}
	}
	// Deliver first, so the done goroutine is counted before Close can see
	// no active relay.
	s.deliver(Result{Err: err})
	s.e.ended()
}

func (s *session) deliver(res Result) {
	s.finished.Store(true)
	if s.ch != nil {
		s.ch <- res // buffered: never blocks the loop
		return
	}
	if s.done != nil {
		s.e.callback(s.done, res)
	}
}

// handedOff maps the *net.TCPConn of each TCPEndpoint an event loop has
// taken over to its relay's session. TCPEndpoint.Abort, which callers use
// to reset a relayed connection from outside (a policy change), looks here
// first: the conn itself is already closed and no longer owns the socket.
// The keys are weak: a closed conn (its netFD and addresses, ~300 B) is not
// kept alive for an idle relay's lifetime unless a caller still holds it,
// and only a caller holding it can look it up.
var handedOff = newConnRegistry()

// connRegistry is a map sharded by key hash: plain maps cost about a
// quarter of a sync.Map's memory per entry, which matters at two entries
// per idle relay.
type connRegistry struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.Mutex // guards m
		m  map[weak.Pointer[net.TCPConn]]*session
		_  [40]byte // keep shards on separate cache lines
	}
}

func newConnRegistry() *connRegistry {
	r := &connRegistry{seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i].m = make(map[weak.Pointer[net.TCPConn]]*session)
	}
	return r
}

func (r *connRegistry) shard(c weak.Pointer[net.TCPConn]) int {
	return int(maphash.Comparable(r.seed, c) % uint64(len(r.shards)))
}

func (r *connRegistry) add(c weak.Pointer[net.TCPConn], s *session) {
	sh := &r.shards[r.shard(c)]
	sh.mu.Lock()
	sh.m[c] = s
	sh.mu.Unlock()
}

func (r *connRegistry) remove(c weak.Pointer[net.TCPConn]) {
	sh := &r.shards[r.shard(c)]
	sh.mu.Lock()
	delete(sh.m, c)
	sh.mu.Unlock()
}

func (r *connRegistry) lookup(c weak.Pointer[net.TCPConn]) *session {
	sh := &r.shards[r.shard(c)]
	sh.mu.Lock()
	s := sh.m[c]
	sh.mu.Unlock()
	return s
}

// Handle controls a relay started with Start or StartByHandle. It is the
// relay's session seen from outside: no allocation of its own per relay.
type Handle session

func (s *session) handle() *Handle { return (*Handle)(s) }

// Abort ends the relay with RST to both peers; its result carries cause
// (ErrAborted when nil). It is safe from any goroutine and does nothing once
// the relay has ended. Use it to close connections a policy change denies.
func (h *Handle) Abort(cause error) {
	if cause == nil {
		cause = ErrAborted
	}
	(*session)(h).abort(cause)
}

// Done reports whether the relay has ended.
func (h *Handle) Done() bool { return h.finished.Load() }
