package enginetest

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// Rig builds the engines under test.
type Rig struct {
	// New returns a fresh engine for one subtest; the suite closes it.
	New func(t testing.TB) *engine.Engine
}

// hang is the safety net on blocking socket calls: a conforming engine
// never gets near it, a broken one fails instead of hanging the run.
const hang = 20 * time.Second

// Run runs the conformance suite against rig.
func Run(t *testing.T, rig Rig) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *engine.Engine, k kit)
	}{
		{"Echo", testEcho},
		{"LargeTransferBothWays", testLarge},
		{"ManyConcurrent", testMany},
		{"HalfCloseFromA", func(t *testing.T, e *engine.Engine, k kit) { testHalfClose(t, e, k, true) }},
		{"HalfCloseFromB", func(t *testing.T, e *engine.Engine, k kit) { testHalfClose(t, e, k, false) }},
		{"ResetFromA", func(t *testing.T, e *engine.Engine, k kit) { testReset(t, e, k, true) }},
		{"ResetFromB", func(t *testing.T, e *engine.Engine, k kit) { testReset(t, e, k, false) }},
		{"SlowReaderDoesNotStallOthers", testSlowReader},
		{"MessagesSmallThenBulkThenSmall", testMessageSizes},
		{"SmallWritesToSlowReader", testSmallWritesSlowReader},
		{"ResetAfterSmallMessages", testResetAfterSmall},
		{"PeerVanishes", testPeerVanishes},
		{"CountersMoveDuringTransfer", testCountersMove},
		{"HandleAbort", testHandleAbort},
		{"EndpointAbortDoesNotReach", testEndpointAbortDoesNotReach},
		{"DrainWaitsForRelays", testDrainWaits},
		{"DrainDeadlineAborts", testDrainDeadline},
		{"CloseAbortsAndRefuses", testClose},
		{"IdleHoldsNothing", testIdleHoldsNothing},
		{"CloseEndsEveryGoroutine", testCloseEndsGoroutines},
	}
	// Every scenario runs with TCP on both sides, with a stream (see
	// Stream) on the B side (the TCP⇄stream relays), and with a stream of
	// a Mux, whose connection the relay's loop owns where the backend
	// allows (epoll) and goroutines drive elsewhere (ErrUnsupported).
	for _, k := range []kit{{}, {stream: true}, {stream: true, homed: true}} {
		t.Run(k.name(), func(t *testing.T) {
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					e := rig.New(t)
					defer e.Close()
					tc.fn(t, e, k)
				})
			}
		})
	}
}

// kit builds the relays of one variant of the suite.
type kit struct {
	stream bool // the B side is a Stream rather than a TCP socket
	homed  bool // the stream is a MuxStream (on its own Mux, AutoClose)
}

func (k kit) name() string {
	switch {
	case k.homed:
		return "TCPToMuxStream"
	case k.stream:
		return "TCPToStream"
	}
	return "TCPToTCP"
}

// loopOwned reports whether e's loops own a Mux's connection.
func loopOwned(e *engine.Engine) bool { return e.Backend() == engine.BackendEpoll }

// ownGoroutines is how many goroutines each relay's B side runs itself
// (the fakes' stand-ins for the HBONE connection's), on e.
func (k kit) ownGoroutines(e *engine.Engine) int {
	switch {
	case k.homed && loopOwned(e):
		return 3 // the MuxPeer's reader, its stream's two
	case k.homed:
		return 5 // and the Mux's reader and writer
	case k.stream:
		return 2
	}
	return 0
}

// newMux connects a Mux on e to a MuxPeer that bridges its streams to
// socket, and checks TakeConn's answer: loop-owned on epoll,
// ErrUnsupported (the goroutine fallback) elsewhere.
func newMux(t testing.TB, e *engine.Engine, socket func() *net.TCPConn, opt MuxOptions) *Mux {
	t.Helper()
	mc, rc := nettest.TCPPair(t)
	m, err := NewMux(e, mc, opt)
	switch {
	case errors.Is(err, engine.ErrClosed):
		// A closed engine: the relay is refused too (testClose).
	case loopOwned(e) && err != nil:
		t.Fatalf("TakeConn on %s: %v", e.Backend(), err)
	case !loopOwned(e) && !errors.Is(err, engine.ErrUnsupported):
		t.Fatalf("TakeConn on %s = %v, want ErrUnsupported", e.Backend(), err)
	case !loopOwned(e) && m.Handle() != nil:
		t.Fatal("a fallen-back Mux has a loop handle")
	}
	NewMuxPeer(rc, func(uint32) *net.TCPConn { return socket() })
	return m
}

// ends returns a relay's endpoints and the connections of the peers behind
// them: client talks to a, server sits behind b.
func (k kit) ends(t testing.TB, e *engine.Engine) (client *net.TCPConn, a, b engine.Endpoint, server *net.TCPConn) {
	client, ca := nettest.TCPPair(t)
	cb, server := nettest.TCPPair(t)
	a = engine.TCPEndpoint{TCPConn: ca}
	switch {
	case k.homed:
		m := newMux(t, e, func() *net.TCPConn { return cb }, MuxOptions{AutoClose: true})
		b = m.Open()
	case k.stream:
		b = NewStream(cb)
	default:
		b = engine.TCPEndpoint{TCPConn: cb}
	}
	return client, a, b, server
}

func (k kit) pair(t testing.TB, e *engine.Engine) *Pair {
	if !k.stream {
		return NewPair(t, e)
	}
	client, a, b, server := k.ends(t, e)
	p := &Pair{Client: client, Server: server, Counters: new(engine.Counters), Done: make(chan engine.Result, 1)}
	p.Handle = e.Start(a, b, p.Counters, func(r engine.Result) { p.Done <- r })
	return p
}

// open is pair with the safety-net deadline set on both peers.
func (k kit) open(t testing.TB, e *engine.Engine) *Pair {
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	return p
}

// openUp opens n relays and passes a ping through each, so that every one
// is up and has moved bytes.
func (k kit) openUp(t testing.TB, e *engine.Engine, n int) []*Pair {
	t.Helper()
	pairs := make([]*Pair, n)
	for i := range pairs {
		pairs[i] = k.open(t, e)
		pass(t, pairs[i].Client, pairs[i].Server, "ping")
	}
	return pairs
}

// pass writes msg to from and reads it at to: the relay is up that way.
func pass(t testing.TB, from, to *net.TCPConn, msg string) {
	t.Helper()
	from.Write([]byte(msg))
	if _, err := io.ReadFull(to, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
}

// wantReset reads c to its end and fails unless the end is a reset; who
// names c in the failure.
func wantReset(t testing.TB, c *net.TCPConn, who string) {
	t.Helper()
	if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("%s read %v, want ECONNRESET", who, err)
	}
}

// Pair is one relay under test: Client talks to the relay's A side, Server
// sits behind its B side.
type Pair struct {
	Client, Server *net.TCPConn
	Counters       *engine.Counters
	Handle         *engine.Handle
	Done           chan engine.Result
}

// Result waits for the relay's result.
func (p *Pair) Result(t testing.TB) engine.Result {
	t.Helper()
	select {
	case r := <-p.Done:
		return r
	case <-time.After(hang):
		t.Fatal("relay did not end")
		return engine.Result{}
	}
}

// wantClean waits for the relay's result and fails unless it is a clean
// end.
func (p *Pair) wantClean(t testing.TB) {
	t.Helper()
	if res := p.Result(t); res.Err != nil {
		t.Fatalf("relay ended with %v, want a clean end", res.Err)
	}
}

// wantFailed waits for the relay's result and fails if it is a clean end:
// after says what should have ended it otherwise.
func (p *Pair) wantFailed(t testing.TB, after string) {
	t.Helper()
	if res := p.Result(t); res.Err == nil {
		t.Fatal("relay reported a clean end after " + after)
	}
}

// wantErr waits for the relay's result and fails unless it is target.
func (p *Pair) wantErr(t testing.TB, target error) {
	t.Helper()
	if res := p.Result(t); !errors.Is(res.Err, target) {
		t.Fatalf("result %v, want %v", res.Err, target)
	}
}

// NewPair connects a client and a server through a relay started on e.
func NewPair(t testing.TB, e *engine.Engine) *Pair {
	t.Helper()
	client, a := nettest.TCPPair(t)
	b, server := nettest.TCPPair(t)
	p := &Pair{Client: client, Server: server, Counters: new(engine.Counters), Done: make(chan engine.Result, 1)}
	p.Handle = e.Start(engine.TCPEndpoint{TCPConn: a}, engine.TCPEndpoint{TCPConn: b}, p.Counters, func(r engine.Result) { p.Done <- r })
	return p
}
