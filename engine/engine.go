package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"
)

// Backend names, as Config.Backend and Engine.Backend spell them (and the
// daemon's ZTUNNEL_ENGINE, which internal/app reads into Config.Backend).
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

var (
	// ErrClosed ends relays still running when their Engine is closed, and
	// relays handed to an Engine that is already closed.
	ErrClosed = errors.New("engine: closed")
	// ErrIdleTimeout ends a relay that moved no byte for Config.IdleTimeout.
	ErrIdleTimeout = errors.New("engine: relay idle timeout")
	// ErrAborted ends a relay aborted through its Handle with no cause.
	ErrAborted = errors.New("engine: relay aborted")
)

// Config configures an Engine. The zero value is usable: auto backend, one
// loop per GOMAXPROCS, 1 MiB pipes, no idle timeout.
type Config struct {
	// Backend is one of the Backend* names; "" means BackendAuto. A
	// backend named here that the kernel refuses is an error from New,
	// unless Fallback is set.
	Backend string
	// Fallback makes a named backend the kernel refuses fall back to
	// BackendAuto instead of failing New; Engine.Fallback then says why.
	// The daemon sets it, so ZTUNNEL_ENGINE=uring on a kernel that refuses
	// io_uring runs epoll (and logs it).
	Fallback bool
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
	// BlockStreamLoops makes the epoll backend's TCP⇄stream loops block
	// their goroutine in epoll_wait as its TCP⇄TCP loops do, instead of
	// parking in the runtime's netpoller (ZTUNNEL_ENGINE_STREAM_WAIT=block).
	// It pays where the loops own the HBONE connections of their streams
	// (StartConn): they are then woken by their own descriptors, not by
	// reader goroutines, and blocking saves the nested epoll's extra
	// calls per wake-up (docs/design/hbone-loop.md, "Waiting").
	BlockStreamLoops bool
	// Logf, if set, receives the engine's rare notes (a loop whose poller
	// broke). Nil discards them. The backend choice and a fallback are the
	// caller's to log (Backend, Fallback).
	Logf func(format string, args ...any)
}

// Engine runs relays. It is safe for concurrent use.
type Engine struct {
	cfg      Config
	name     string
	backend  backend // nil for BackendStd
	fallback error   // why the backend asked for does not run, nil if it does

	mu        sync.Mutex // guards the following fields
	idle      sync.Cond  // signalled when active+conns or callbacks drops to zero
	closed    bool
	active    int             // relays started and not yet ended
	conns     int             // loop-owned connections started and not yet ended
	callbacks int             // done functions running
	drained   []chan struct{} // closed when active drops to zero
	stdLive   map[*stdRelay]struct{}
	watch     *watcher // WatchReadable's (watch_linux.go), made on first use

	// detachFault, set by tests before any relay starts, makes handOff's
	// takeover of a socket fail with the error it returns for that conn.
	detachFault func(*net.TCPConn) error
	// noPeek, set by benchmarks before any relay starts, makes TCP⇄stream
	// relays copy received stream bytes with TryRead even from a
	// StreamPeeker, and read the socket with TryWrite even into a
	// StreamFiller (export_linux_test.go).
	noPeek bool
}

// backend is the seam between an Engine and one way of running TCP⇄TCP
// relays in event loops (epoll_*.go, uring_*.go). Pairs that are not TCP
// to TCP always take the goroutine relay (std.go).
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

// New makes an Engine. Its loops start with the first relay, so an Engine
// with no relay holds no thread. Its owner (the daemon) closes or drains
// it after the last user is done with it.
func New(cfg Config) (*Engine, error) {
	if cfg.Loops <= 0 {
		cfg.Loops = runtime.GOMAXPROCS(0)
	}
	if cfg.Linger <= 0 {
		cfg.Linger = 100 * time.Millisecond
	}
	want := cfg.Backend
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
		if !cfg.Fallback {
			return nil, err
		}
		e.fallback = fmt.Errorf("%s unavailable: %w", want, err)
	case BackendAuto:
	default:
		return nil, fmt.Errorf("engine: unknown backend %q (want std, epoll, uring or auto)", want)
	}
	var errs []error
	for _, name := range autoOrder {
		b, err := newBackend(name, e)
		if err == nil {
			e.name, e.backend = name, b
			return e, nil
		}
		errs = append(errs, err)
	}
	// No event-loop backend: relaying with goroutines.
	e.fallback = errors.Join(append([]error{e.fallback}, errs...)...)
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

// Fallback says why the engine runs another backend than the one asked
// for (a kernel that refuses io_uring, no event-loop backend at all), nil
// when it runs the one asked for or auto found an event-loop backend.
func (e *Engine) Fallback() error { return e.fallback }

// ended is called once per begun relay when it ends.
func (e *Engine) ended() {
	e.mu.Lock()
	e.active--
	e.idleCheckLocked()
	e.mu.Unlock()
}

// idleCheckLocked releases Drain and Close once no relay and no
// loop-owned connection is left. e.mu held.
func (e *Engine) idleCheckLocked() {
	if e.active+e.conns == 0 {
		for _, ch := range e.drained {
			close(ch)
		}
		e.drained = nil
		e.idle.Broadcast()
	}
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

// Drain waits until every relay and every loop-owned connection has ended
// or ctx is done, then closes the engine (aborting what is left with
// ErrClosed). New relays are still accepted while it waits: stop the
// listeners first.
func (e *Engine) Drain(ctx context.Context) error {
	e.mu.Lock()
	var ch chan struct{}
	if e.active+e.conns > 0 && !e.closed {
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

// Close aborts every relay with ErrClosed (RST to both peers), ends every
// loop-owned connection with ConnDriver.Ended(ErrClosed), stops the loops
// and waits for them and for the done callbacks. Relays handed over
// afterwards are refused. It is idempotent; a second call returns ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.closed = true
	wr := e.watch
	live := make([]*stdRelay, 0, len(e.stdLive))
	for r := range e.stdLive {
		live = append(live, r)
	}
	e.mu.Unlock()
	if wr != nil {
		wr.close()
	}
	for _, r := range live {
		r.abort(ErrClosed)
	}
	if e.backend != nil {
		e.backend.close()
	}
	// Goroutine relays end soon after their abort; wait for them and for
	// the done functions.
	e.mu.Lock()
	for e.active+e.conns > 0 || e.callbacks > 0 {
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
	// DirectWrites counts, since the engine started, the socket writes
	// TCP⇄stream relays let the stream's receiving goroutine make itself
	// (TryDeliver: the loop was not woken for those bytes).
	DirectWrites int64
	// Conns counts the loop-owned connections (StartConn) held by the
	// loops.
	Conns int
	// ConnStalls counts, since the engine started, the ConnDriver calls
	// that took over 1 ms: each held up every other connection and relay
	// of its loop (the loop's watchdog).
	ConnStalls int64
	// LocalWakes counts, since the engine started, the stream relays a
	// loop-owned connection's driver readied on its own loop without a
	// task (ConnHandle.WakeLocal).
	LocalWakes int64
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
