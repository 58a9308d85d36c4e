// The lifecycle scenarios: a relay ended from outside (its Handle, a
// drain, the engine's Close), what an idle relay holds, and what a closed
// engine leaves behind.

package enginetest

import (
	"context"
	"errors"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

func testHandleAbort(t *testing.T, e *engine.Engine, k kit) {
	p := k.open(t, e)
	pass(t, p.Client, p.Server, "x")
	cause := errors.New("policy changed")
	p.Handle.Abort(cause)
	p.wantErr(t, cause)
	wantReset(t, p.Client, "client after abort")
	wantReset(t, p.Server, "server after abort")
	if !p.Handle.Done() {
		t.Fatal("handle not done after the result")
	}
	p.Handle.Abort(nil) // after the end: a no-op
}

// testEndpointAbortDoesNotReach: an endpoint handed to an event loop is no
// way to the relay (the engine keeps no record of it): its Abort leaves the
// relay running, and the Handle still resets it.
func testEndpointAbortDoesNotReach(t *testing.T, e *engine.Engine, k kit) {
	if e.Backend() == engine.BackendStd {
		t.Skip("the std backend keeps the endpoints: their Abort resets the relay")
	}
	if k.stream && e.Backend() != engine.BackendEpoll {
		t.Skipf("the %s backend relays streams with goroutines, on the endpoints", e.Backend())
	}
	client, ea, b, server := k.ends(t, e)
	deadline(client, server)
	done := make(chan engine.Result, 1)
	h := e.Start(ea, b, nil, func(r engine.Result) { done <- r })
	pass(t, client, server, "x")
	ea.Abort()
	// Still relaying: a byte goes through after the endpoint's Abort.
	client.Write([]byte("y"))
	if _, err := io.ReadFull(server, make([]byte, 1)); err != nil {
		t.Fatalf("relay stopped after the endpoint's Abort: %v", err)
	}
	h.Abort(nil)
	select {
	case r := <-done:
		if !errors.Is(r.Err, engine.ErrAborted) {
			t.Fatalf("result %v, want ErrAborted", r.Err)
		}
	case <-time.After(hang):
		t.Fatal("relay did not end after its Handle's Abort")
	}
	wantReset(t, client, "client after abort")
	wantReset(t, server, "server after abort")
}

func testDrainWaits(t *testing.T, e *engine.Engine, k kit) {
	pairs := []*Pair{k.pair(t, e), k.pair(t, e), k.pair(t, e)}
	drained := make(chan error, 1)
	go func() { drained <- e.Drain(context.Background()) }()
	// The relays finish on their own; Drain returns after the last.
	for i, p := range pairs {
		roundTrip(t, p, 1000, uint64(300+i))
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("Drain = %v", err)
		}
	case <-time.After(hang):
		t.Fatal("Drain did not return after the relays ended")
	}
}

func testDrainDeadline(t *testing.T, e *engine.Engine, k kit) {
	p := k.open(t, e)
	pass(t, p.Client, p.Server, "x")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Drain(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain = %v, want context.Canceled", err)
	}
	p.wantErr(t, engine.ErrClosed)
	wantReset(t, p.Client, "client")
}

func testClose(t *testing.T, e *engine.Engine, k kit) {
	p := k.open(t, e)
	pass(t, p.Client, p.Server, "x")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	p.wantErr(t, engine.ErrClosed)
	wantReset(t, p.Server, "server")
	// A relay handed to a closed engine is refused and both peers reset.
	late := k.open(t, e)
	late.wantErr(t, engine.ErrClosed)
	wantReset(t, late.Client, "late client")
	if err := e.Close(); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
}

// testIdleHoldsNothing checks the event-loop promise: once its bytes have
// moved, an idle relay holds no goroutine and no pipe.
func testIdleHoldsNothing(t *testing.T, e *engine.Engine, k kit) {
	if e.Backend() == engine.BackendStd {
		t.Skip("the std backend holds two goroutines per relay by design")
	}
	if k.stream && e.Backend() != engine.BackendEpoll {
		t.Skipf("the %s backend relays streams with goroutines", e.Backend())
	}
	const n = 100
	before := runtime.NumGoroutine()
	pairs := k.openUp(t, e, n)
	// The loop returns a pipe (or a stream buffer) right after the splice
	// (write) that empties it, which may be just after the server has read:
	// wait for it.
	var st engine.Stats
	nettest.Until(hang, func() bool { st = e.Stats(); return st.PipesInUse == 0 && st.StreamBuffers == 0 })
	if st.PipesInUse != 0 {
		t.Fatalf("%d pipes held by idle relays", st.PipesInUse)
	}
	if st.LoopRelays != n {
		t.Fatalf("stats: %d relays in loops, want %d", st.LoopRelays, n)
	}
	if st.StreamBuffers != 0 {
		t.Fatalf("%d buffers held by idle stream relays", st.StreamBuffers)
	}
	if k.homed && st.Conns != n {
		t.Fatalf("stats: %d loop-owned connections, want %d", st.Conns, n)
	}
	// At most the loops themselves were added (and the fakes' own
	// goroutines, which stand for the HBONE connection's and its peer's).
	own := n * k.ownGoroutines(e)
	if grown := runtime.NumGoroutine() - before - own; grown > st.Loops+st.StreamLoops {
		t.Fatalf("%d idle relays added %d goroutines (loops: %d+%d)", n, grown, st.Loops, st.StreamLoops)
	}
	for _, p := range pairs {
		p.Client.CloseWrite()
		p.Server.CloseWrite()
	}
	for _, p := range pairs {
		p.wantClean(t)
	}
}

// testCloseEndsGoroutines: an engine that ran relays leaves nothing behind
// once closed. Its loops (or relay goroutines), the done callbacks and the
// test Streams' goroutines all end: the goroutine count is back to what it
// was before the engine's first relay.
func testCloseEndsGoroutines(t *testing.T, e *engine.Engine, k kit) {
	const n = 20
	before := runtime.NumGoroutine()
	pairs := k.openUp(t, e, n)
	inLoops := e.Backend() == engine.BackendEpoll || (!k.stream && e.Backend() == engine.BackendUring)
	if st := e.Stats(); st.Relays != n || inLoops != (st.Running > 0) {
		t.Fatalf("stats %+v: want %d relays, in running loops: %v", st, n, inLoops)
	}
	if runtime.NumGoroutine() <= before {
		t.Fatal("the running relays added no goroutine: the check below would prove nothing")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range pairs {
		p.wantErr(t, engine.ErrClosed)
	}
	if st := e.Stats(); st.Running != 0 || st.Relays != 0 || st.LoopRelays != 0 || st.Conns != 0 {
		t.Fatalf("stats %+v after Close: want no loop running and no relay", st)
	}
	// Goroutines that delivered their last result return just after it.
	var got int
	nettest.Until(hang, func() bool { got = runtime.NumGoroutine(); return got <= before })
	if got > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Close, %d before the relays:\n%s", got, before, buf[:runtime.Stack(buf, true)])
	}
}
