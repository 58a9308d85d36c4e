package engine

import (
	"sync"
	"sync/atomic"
)

// aborter ends a running relay from outside its owner.
type aborter interface{ abort(cause error) }

// session is the engine's record of one relay, whatever runs it. An idle
// relay holds one: 64 bytes, a size class (TestRelaySizeClass).
type session struct {
	e        *Engine
	counters *Counters
	done     func(Result)
	finished atomic.Bool

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
	// Deliver first, so the done goroutine is counted before Close can see
	// no active relay.
	s.deliver(Result{Err: err})
	s.e.ended()
}

func (s *session) deliver(res Result) {
	s.finished.Store(true)
	if s.done != nil {
		s.e.callback(s.done, res)
	}
}

// Handle controls a relay started with Start or StartDial. It is the
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
