package engine

import (
	"fmt"
	"net"
)

// Start hands a relay between a and b to the engine and returns at once;
// it is the one way in for a decided connection (StartDial is Start with
// the connect to B left to the engine). The dispatch, in this order:
//
//   - two TCPEndpoints on an event-loop backend: the loop takes both
//     sockets over (the *net.TCPConns are closed at once; use nothing of
//     them afterwards) and the relay holds no goroutine;
//   - a TCPEndpoint and a StreamEndpoint on the epoll backend: the loop
//     takes the socket over and drives the stream (stream.go);
//   - any other pair, and every pair on the std backend: two goroutines
//     owned by the engine (std.go).
//
// The relay is reset from outside only through the returned Handle: an
// endpoint handed to a loop is closed, so its Abort no longer reaches the
// relay, and the engine keeps no record per socket.
//
// done, if not nil, is called once with the result after both endpoints are
// closed, on a goroutine of its own (it may block; Close waits for it).
// counters, if not nil, moves as bytes flow.
func (e *Engine) Start(a, b Endpoint, counters *Counters, done func(Result)) *Handle {
	if counters == nil {
		counters = new(Counters)
	}
	s, ok := e.begin(counters, done)
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

// handOff takes the sockets from their *net.TCPConns and gives them to the
// backend.
func (e *Engine) handOff(a, b TCPEndpoint, s *session) {
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

// handOffStream takes the socket from its *net.TCPConn and gives it, with
// the stream, to the backend.
func (e *Engine) handOffStream(t TCPEndpoint, st StreamEndpoint, tcpSide int, s *session) {
	fd, err := e.detach(t.TCPConn)
	if err != nil {
		resetConn(t.TCPConn)
		_ = st.Abort()
		_ = st.Close()
		s.finish(fmt.Errorf("engine: take over socket: %w", err))
		return
	}
	e.backend.(streamBackend).relayStream(fd, tcpSide, st, s)
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
func (e *Engine) begin(c *Counters, done func(Result)) (*session, bool) {
	s := &session{e: e, counters: c, done: done}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return s, false
	}
	e.active++
	return s, true
}

// refuse ends a relay handed to a closed engine: both ends are reset.
func (e *Engine) refuse(a, b Endpoint, s *session) {
	_ = a.Abort()
	_ = b.Abort()
	s.deliver(Result{Err: ErrClosed})
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
