package enginetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
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
	// Every scenario runs with TCP on both sides and with a stream (see
	// Stream) on the B side: the TCP⇄stream relays.
	for _, k := range []kit{{}, {stream: true}} {
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
}

func (k kit) name() string {
	if k.stream {
		return "TCPToStream"
	}
	return "TCPToTCP"
}

// ends returns a relay's endpoints and the connections of the peers behind
// them: client talks to a, server sits behind b.
func (k kit) ends(t testing.TB) (client *net.TCPConn, a, b engine.Endpoint, server *net.TCPConn) {
	client, ca := tcpPair(t)
	cb, server := tcpPair(t)
	a = engine.TCPEndpoint{TCPConn: ca}
	if k.stream {
		b = NewStream(cb)
	} else {
		b = engine.TCPEndpoint{TCPConn: cb}
	}
	return client, a, b, server
}

func (k kit) pair(t testing.TB, e *engine.Engine) *Pair {
	if !k.stream {
		return NewPair(t, e)
	}
	client, a, b, server := k.ends(t)
	p := &Pair{Client: client, Server: server, Counters: new(engine.Counters), Done: make(chan engine.Result, 1)}
	p.Handle = e.Start(a, b, p.Counters, func(r engine.Result) { p.Done <- r })
	return p
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

// NewPair connects a client and a server through a relay started on e.
func NewPair(t testing.TB, e *engine.Engine) *Pair {
	t.Helper()
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	p := &Pair{Client: client, Server: server, Counters: new(engine.Counters), Done: make(chan engine.Result, 1)}
	p.Handle = e.Start(engine.TCPEndpoint{TCPConn: a}, engine.TCPEndpoint{TCPConn: b}, p.Counters, func(r engine.Result) { p.Done <- r })
	return p
}

// tcpPair returns both ends of a fresh loopback TCP connection.
func tcpPair(t testing.TB) (dialed, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// stream is a reproducible pseudo-random byte source.
func stream(seed uint64, n int64) io.Reader {
	var s [32]byte
	s[0] = byte(seed)
	s[1] = byte(seed >> 8)
	return io.LimitReader(rand.NewChaCha8(s), n)
}

func digest(r io.Reader) ([32]byte, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, n, err
}

func deadline(cs ...*net.TCPConn) {
	for _, c := range cs {
		c.SetDeadline(time.Now().Add(hang))
	}
}

// progress is a connection whose every Read and Write must complete within
// hang: the safety net of a transfer too large to finish within hang.
type progress struct{ c *net.TCPConn }

func (p progress) Read(b []byte) (int, error) {
	_ = p.c.SetReadDeadline(time.Now().Add(hang))
	return p.c.Read(b)
}

func (p progress) Write(b []byte) (int, error) {
	_ = p.c.SetWriteDeadline(time.Now().Add(hang))
	return p.c.Write(b)
}

// echo makes the server side copy everything back and half-close at EOF.
func echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

// roundTrip sends size random bytes through an echoing server and checks
// what comes back.
func roundTrip(t testing.TB, p *Pair, size int64, seed uint64) {
	t.Helper()
	deadline(p.Client, p.Server)
	go echo(p.Server)
	want, _, _ := digest(stream(seed, size))
	werr := make(chan error, 1)
	go func() {
		_, err := io.Copy(p.Client, stream(seed, size))
		if err == nil {
			err = p.Client.CloseWrite()
		}
		werr <- err
	}()
	got, n, err := digest(p.Client)
	if err != nil || n != size {
		t.Fatalf("read back %d of %d bytes: %v", n, size, err)
	}
	if got != want {
		t.Fatal("echoed bytes differ from those sent")
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if res := p.Result(t); res.Err != nil {
		t.Fatalf("relay ended with %v, want a clean end", res.Err)
	}
	if a, b := p.Counters.AToB.Load(), p.Counters.BToA.Load(); a != size || b != size {
		t.Fatalf("counters A→B %d B→A %d, want %d each", a, b, size)
	}
}

func testEcho(t *testing.T, e *engine.Engine, k kit) {
	for i, size := range []int64{0, 1, 1000, 65536 + 3, 1 << 20} {
		roundTrip(t, k.pair(t, e), size, uint64(i))
	}
}

func testLarge(t *testing.T, e *engine.Engine, k kit) {
	size := int64(64 << 20)
	if testing.Short() {
		size = 8 << 20
	}
	p := k.pair(t, e)
	// Independent streams each way, at the same time. The safety net is a
	// deadline on each read and write, not on the whole transfer: under
	// -race on a loaded machine a healthy relay may take longer than hang
	// for all of it, but never that long without moving a byte.
	check := func(name string, w, r *net.TCPConn, seed uint64, errs chan<- error) {
		go func() {
			_, err := io.Copy(progress{w}, stream(seed, size))
			if err == nil {
				err = w.CloseWrite()
			}
			if err != nil {
				errs <- err
			}
		}()
		want, _, _ := digest(stream(seed, size))
		got, n, err := digest(progress{r})
		switch {
		case err != nil:
			errs <- err
		case n != size || got != want:
			errs <- errors.New(name + ": bytes differ from those sent")
		default:
			errs <- nil
		}
	}
	errs := make(chan error, 4)
	go check("A→B", p.Client, p.Server, 1, errs)
	go check("B→A", p.Server, p.Client, 2, errs)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if res := p.Result(t); res.Err != nil {
		t.Fatalf("relay ended with %v", res.Err)
	}
	if a, b := p.Counters.AToB.Load(), p.Counters.BToA.Load(); a != size || b != size {
		t.Fatalf("counters %d/%d, want %d", a, b, size)
	}
}

func testMany(t *testing.T, e *engine.Engine, k kit) {
	n := 200
	if testing.Short() {
		n = 50
	}
	pairs := make([]*Pair, n)
	for i := range pairs {
		pairs[i] = k.pair(t, e)
	}
	var wg sync.WaitGroup
	for i, p := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			roundTrip(t, p, 64<<10+int64(i), uint64(100+i))
		}()
	}
	wg.Wait()
}

func testHalfClose(t *testing.T, e *engine.Engine, k kit, fromA bool) {
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	first, second := p.Client, p.Server
	if !fromA {
		first, second = second, first
	}
	// first says its piece and half-closes; second reads to EOF, then
	// answers over the direction that is still open.
	first.Write([]byte("request"))
	first.CloseWrite()
	got, err := io.ReadAll(second)
	if err != nil || string(got) != "request" {
		t.Fatalf("read %q, %v before EOF", got, err)
	}
	answer := bytes.Repeat([]byte("answer after half-close "), 10000)
	go func() {
		second.Write(answer)
		second.CloseWrite()
	}()
	got, err = io.ReadAll(first)
	if err != nil || !bytes.Equal(got, answer) {
		t.Fatalf("half-closed side read %d bytes, %v; want %d", len(got), err, len(answer))
	}
	if res := p.Result(t); res.Err != nil {
		t.Fatalf("relay ended with %v", res.Err)
	}
}

func abort(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func testReset(t *testing.T, e *engine.Engine, k kit, fromA bool) {
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	resetter, other := p.Client, p.Server
	if !fromA {
		resetter, other = other, resetter
	}
	// Make sure the relay is up, then reset one end.
	resetter.Write([]byte("x"))
	if _, err := io.ReadFull(other, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	abort(resetter)
	_, err := io.ReadAll(other)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("other side read error %v, want ECONNRESET", err)
	}
	if res := p.Result(t); res.Err == nil {
		t.Fatal("relay reported a clean end after a reset")
	}
}

func testSlowReader(t *testing.T, e *engine.Engine, k kit) {
	slow := k.pair(t, e)
	deadline(slow.Client, slow.Server)
	const size = 16 << 20
	// The client pushes far more than the socket buffers hold while the
	// server does not read: the relay must stall that direction only.
	werr := make(chan error, 1)
	go func() {
		_, err := io.Copy(slow.Client, stream(7, size))
		if err == nil {
			err = slow.Client.CloseWrite()
		}
		werr <- err
	}()
	// Meanwhile other relays on the same engine keep moving.
	for i := range 4 {
		roundTrip(t, k.pair(t, e), 256<<10, uint64(200+i))
	}
	// Now read slowly, in small pieces.
	want, _, _ := digest(stream(7, size))
	h := sha256.New()
	buf := make([]byte, 3000)
	var n int64
	for {
		m, err := slow.Server.Read(buf)
		h.Write(buf[:m])
		n += int64(m)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if n%(1<<20) < 3000 {
			runtime.Gosched()
		}
	}
	if n != size || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("slow reader got %d bytes (want %d) or different bytes", n, size)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	slow.Server.CloseWrite()
	if res := slow.Result(t); res.Err != nil {
		t.Fatalf("relay ended with %v", res.Err)
	}
}

func testPeerVanishes(t *testing.T, e *engine.Engine, k kit) {
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	p.Client.Write([]byte("hello"))
	if _, err := io.ReadFull(p.Server, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	// The server goes away without reading what keeps coming: its kernel
	// answers further data with RST, which must reach the client.
	p.Server.Close()
	buf := bytes.Repeat([]byte("z"), 64<<10)
	var err error
	for err == nil {
		_, err = p.Client.Write(buf)
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		// The reset arrived while writing.
	} else {
		t.Fatalf("client write error %v, want a reset", err)
	}
	if res := p.Result(t); res.Err == nil {
		t.Fatal("relay reported a clean end after its peer vanished")
	}
}

func testCountersMove(t *testing.T, e *engine.Engine, k kit) {
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	// A multiple of the std relay's counting step (it counts each 4 MiB
	// splice when it completes).
	const chunk = 8 << 20
	werr := make(chan error, 1)
	go func() {
		_, err := io.Copy(p.Client, stream(9, chunk))
		werr <- err
	}()
	if _, err := io.CopyN(io.Discard, p.Server, chunk); err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	// The relay is still open; its counter must reach what was delivered
	// (the relay adds after the kernel has moved the bytes, so wait for it).
	for stop := time.Now().Add(hang); p.Counters.AToB.Load() < chunk; {
		select {
		case r := <-p.Done:
			t.Fatalf("relay ended early: %v", r.Err)
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(stop) {
			break
		}
	}
	if got := p.Counters.AToB.Load(); got != chunk {
		t.Fatalf("A→B counter %d while the relay is open, want %d", got, chunk)
	}
	p.Client.CloseWrite()
	p.Server.CloseWrite()
	if res := p.Result(t); res.Err != nil {
		t.Fatal(res.Err)
	}
}

func testHandleAbort(t *testing.T, e *engine.Engine, k kit) {
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	p.Client.Write([]byte("x"))
	if _, err := io.ReadFull(p.Server, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("policy changed")
	p.Handle.Abort(cause)
	if res := p.Result(t); !errors.Is(res.Err, cause) {
		t.Fatalf("result %v, want the abort cause", res.Err)
	}
	for _, c := range []*net.TCPConn{p.Client, p.Server} {
		if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("peer read %v after abort, want ECONNRESET", err)
		}
	}
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
	client, ea, b, server := k.ends(t)
	deadline(client, server)
	done := make(chan engine.Result, 1)
	h := e.Start(ea, b, nil, func(r engine.Result) { done <- r })
	client.Write([]byte("x"))
	if _, err := io.ReadFull(server, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
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
	for _, c := range []*net.TCPConn{client, server} {
		if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("peer read %v after abort, want ECONNRESET", err)
		}
	}
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
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	p.Client.Write([]byte("x"))
	if _, err := io.ReadFull(p.Server, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Drain(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain = %v, want context.Canceled", err)
	}
	if res := p.Result(t); !errors.Is(res.Err, engine.ErrClosed) {
		t.Fatalf("result %v, want ErrClosed", res.Err)
	}
	if _, err := io.ReadAll(p.Client); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read %v, want ECONNRESET", err)
	}
}

func testClose(t *testing.T, e *engine.Engine, k kit) {
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	p.Client.Write([]byte("x"))
	if _, err := io.ReadFull(p.Server, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if res := p.Result(t); !errors.Is(res.Err, engine.ErrClosed) {
		t.Fatalf("result %v, want ErrClosed", res.Err)
	}
	if _, err := io.ReadAll(p.Server); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("server read %v, want ECONNRESET", err)
	}
	// A relay handed to a closed engine is refused and both peers reset.
	late := k.pair(t, e)
	deadline(late.Client, late.Server)
	if res := late.Result(t); !errors.Is(res.Err, engine.ErrClosed) {
		t.Fatalf("late relay: %v, want ErrClosed", res.Err)
	}
	if _, err := io.ReadAll(late.Client); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("late client read %v, want ECONNRESET", err)
	}
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
	pairs := make([]*Pair, n)
	for i := range pairs {
		p := k.pair(t, e)
		pairs[i] = p
		deadline(p.Client, p.Server)
		p.Client.Write([]byte("ping"))
		if _, err := io.ReadFull(p.Server, make([]byte, 4)); err != nil {
			t.Fatal(err)
		}
	}
	// The loop returns a pipe (or a stream buffer) right after the splice
	// (write) that empties it, which may be just after the server has read:
	// wait for it.
	st := e.Stats()
	for stop := time.Now().Add(hang); (st.PipesInUse != 0 || st.StreamBuffers != 0) && time.Now().Before(stop); st = e.Stats() {
		time.Sleep(time.Millisecond)
	}
	if st.PipesInUse != 0 {
		t.Fatalf("%d pipes held by idle relays", st.PipesInUse)
	}
	if st.LoopRelays != n {
		t.Fatalf("stats: %d relays in loops, want %d", st.LoopRelays, n)
	}
	if st.StreamBuffers != 0 {
		t.Fatalf("%d buffers held by idle stream relays", st.StreamBuffers)
	}
	// At most the loops themselves were added (and the test Streams' own
	// two goroutines each, which stand for the HBONE connection's).
	own := 0
	if k.stream && e.Backend() == engine.BackendEpoll {
		own = 2 * n
	}
	if grown := runtime.NumGoroutine() - before - own; grown > st.Loops+st.StreamLoops {
		t.Fatalf("%d idle relays added %d goroutines (loops: %d+%d)", n, grown, st.Loops, st.StreamLoops)
	}
	for _, p := range pairs {
		p.Client.CloseWrite()
		p.Server.CloseWrite()
	}
	for _, p := range pairs {
		if res := p.Result(t); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
}

// testMessageSizes sends messages one at a time, each echoed before the
// next, of sizes around the points where a relay may change how it moves
// bytes (a copy buffer's size, a pipe's): small ones, then bulk, then small
// again, in both directions.
func testMessageSizes(t *testing.T, e *engine.Engine, k kit) {
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	go echo(p.Server)
	sizes := []int64{1, 7, 100, 4095, 16<<10 - 1, 16 << 10, 16<<10 + 1, 64 << 10, 4 << 20, 1, 3, 1000, 32<<10 + 5, 2}
	var total int64
	for i, size := range sizes {
		want, _, _ := digest(stream(uint64(300+i), size))
		werr := make(chan error, 1)
		go func() {
			_, err := io.Copy(p.Client, stream(uint64(300+i), size))
			werr <- err
		}()
		got, n, err := digest(io.LimitReader(progress{p.Client}, size))
		if err != nil || n != size {
			t.Fatalf("message %d: read back %d of %d bytes: %v", i, n, size, err)
		}
		if got != want {
			t.Fatalf("message %d (%d bytes): echoed bytes differ from those sent", i, size)
		}
		if err := <-werr; err != nil {
			t.Fatalf("message %d: write: %v", i, err)
		}
		total += size
	}
	p.Client.CloseWrite()
	if rest, err := io.ReadAll(p.Client); err != nil || len(rest) != 0 {
		t.Fatalf("after the last message: %d more bytes, %v; want a clean EOF", len(rest), err)
	}
	if res := p.Result(t); res.Err != nil {
		t.Fatalf("relay ended with %v", res.Err)
	}
	if a, b := p.Counters.AToB.Load(), p.Counters.BToA.Load(); a != total || b != total {
		t.Fatalf("counters A→B %d B→A %d, want %d each", a, b, total)
	}
}

// testSmallWritesSlowReader sends many small writes to a server that reads
// nothing until the socket buffers are full, so that a relay has bytes it
// read but cannot send yet; then the server reads everything, in order.
func testSmallWritesSlowReader(t *testing.T, e *engine.Engine, k kit) {
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	p.Client.SetNoDelay(true)
	const msg, count = 700, 12000 // 8.4 MB: far more than the buffers hold
	werr := make(chan error, 1)
	go func() {
		src := stream(11, msg*count)
		buf := make([]byte, msg)
		for range count {
			if _, err := io.ReadFull(src, buf); err != nil {
				werr <- err
				return
			}
			if _, err := p.Client.Write(buf); err != nil {
				werr <- err
				return
			}
		}
		werr <- p.Client.CloseWrite()
	}()
	// The writer blocks once the buffers are full; reading starts only
	// when it has stopped making progress.
	for last := int64(-1); ; {
		time.Sleep(20 * time.Millisecond)
		n := p.Counters.AToB.Load()
		if n == last || n == msg*count {
			break
		}
		last = n
	}
	want, _, _ := digest(stream(11, msg*count))
	got, n, err := digest(progress{p.Server})
	if err != nil || n != msg*count || got != want {
		t.Fatalf("slow reader got %d of %d bytes (%v), or different bytes", n, msg*count, err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	p.Server.CloseWrite()
	if res := p.Result(t); res.Err != nil {
		t.Fatalf("relay ended with %v", res.Err)
	}
	if a := p.Counters.AToB.Load(); a != msg*count {
		t.Fatalf("counter A→B %d, want %d", a, msg*count)
	}
}

// testResetAfterSmall resets the server after a few small exchanges, with
// small writes from the client still arriving: the reset reaches the
// client and the relay reports it. A relay that writes and reads the server
// socket from two goroutines must not lose the reset when the write takes
// its error and the read then sees a plain end of stream.
func testResetAfterSmall(t *testing.T, e *engine.Engine, k kit) {
	p := k.pair(t, e)
	deadline(p.Client, p.Server)
	one := make([]byte, 1)
	for i := range 5 {
		p.Client.Write([]byte{byte(i)})
		if _, err := io.ReadFull(p.Server, one); err != nil || one[0] != byte(i) {
			t.Fatalf("exchange %d: server read %v, %v", i, one, err)
		}
		p.Server.Write(one)
		if _, err := io.ReadFull(p.Client, one); err != nil || one[0] != byte(i) {
			t.Fatalf("exchange %d: client read %v, %v", i, one, err)
		}
	}
	abort(p.Server)
	var err error
	for err == nil {
		_, err = p.Client.Write([]byte("small write after the reset"))
		if err == nil {
			// Reading sees the reset as soon as it has arrived.
			p.Client.SetReadDeadline(time.Now().Add(time.Millisecond))
			_, err = p.Client.Read(one)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				err = nil
			}
		}
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("client saw %v, want a reset", err)
	}
	if res := p.Result(t); res.Err == nil {
		t.Fatal("relay reported a clean end after a reset")
	}
}

// testCloseEndsGoroutines: an engine that ran relays leaves nothing behind
// once closed. Its loops (or relay goroutines), the done callbacks and the
// test Streams' goroutines all end: the goroutine count is back to what it
// was before the engine's first relay.
func testCloseEndsGoroutines(t *testing.T, e *engine.Engine, k kit) {
	const n = 20
	before := runtime.NumGoroutine()
	pairs := make([]*Pair, n)
	for i := range pairs {
		p := k.pair(t, e)
		pairs[i] = p
		deadline(p.Client, p.Server)
		p.Client.Write([]byte("ping"))
		if _, err := io.ReadFull(p.Server, make([]byte, 4)); err != nil {
			t.Fatal(err)
		}
	}
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
		if res := p.Result(t); !errors.Is(res.Err, engine.ErrClosed) {
			t.Fatalf("result %v, want ErrClosed", res.Err)
		}
	}
	if st := e.Stats(); st.Running != 0 || st.Relays != 0 || st.LoopRelays != 0 {
		t.Fatalf("stats %+v after Close: want no loop running and no relay", st)
	}
	// Goroutines that delivered their last result return just after it.
	got := runtime.NumGoroutine()
	for stop := time.Now().Add(hang); got > before && time.Now().Before(stop); got = runtime.NumGoroutine() {
		time.Sleep(time.Millisecond)
	}
	if got > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Close, %d before the relays:\n%s", got, before, buf[:runtime.Stack(buf, true)])
	}
}
