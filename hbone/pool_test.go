package hbone

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// countingDialer dials ts and counts dials.
type countingDialer struct {
	ts    *testServer
	dials atomic.Int32
	gate  chan struct{} // if non-nil, dials wait for it
}

func (d *countingDialer) dial(ctx context.Context) (net.Conn, error) {
	d.dials.Add(1)
	if d.gate != nil {
		select {
		case <-d.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	nc, err := d.ts.dial(ctx)
	if tc, ok := nc.(*net.TCPConn); ok && loopDriven(d.ts.tp, true) {
		return newLoopConn(tc), nil
	}
	return nc, err
}

// suitePool is NewPool(pc) for pools dialing ts: with ts's test loop
// driving their connections when the suite run drives clients by the loop.
func suitePool(ts *testServer, pc PoolConfig) *Pool {
	if loopDriven(ts.tp, true) {
		pc.Config.Drive = ts.loop.drive
	}
	return NewPool(pc)
}

// poolConns returns the connections the pool holds for key.
func poolConns(p *Pool, key string) []*ClientConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := p.keys[key]; k != nil {
		return append([]*ClientConn(nil), k.conns...)
	}
	return nil
}

func TestPoolReuse(t *testing.T) {
	ts := startServer(t, Config{}, echoHandler, true)
	d := &countingDialer{ts: ts}
	p := suitePool(d.ts, PoolConfig{})
	defer p.Close()
	ctx := testContext(t)
	for i := range 5 {
		s, err := p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"})
		if err != nil {
			t.Fatal(err)
		}
		echoRoundTrip(t, s, uint64(i), 1000, 100)
		s.Close()
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials, want 1", n)
	}
	// Another key gets its own connection.
	s, err := p.Connect(ctx, "other", d.dial, &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if n := d.dials.Load(); n != 2 {
		t.Fatalf("%d dials, want 2", n)
	}
}

func TestPoolStreamLimit(t *testing.T) {
	ts := startServer(t, Config{}, holdHandler, false)
	d := &countingDialer{ts: ts}
	p := suitePool(d.ts, PoolConfig{MaxStreamsPerConn: 2})
	defer p.Close()
	ctx := testContext(t)
	var streams []*Stream
	for range 5 {
		s, err := p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	if n := d.dials.Load(); n != 3 {
		t.Fatalf("%d dials for 5 streams at 2 per connection, want 3", n)
	}
	for _, cc := range poolConns(p, "key") {
		if n := cc.NumActiveStreams(); n > 2 {
			t.Errorf("connection with %d streams", n)
		}
	}
	// A freed slot is reused before dialing.
	streams[0].Close()
	waitFor(t, "a slot to free", func() bool {
		for _, cc := range poolConns(p, "key") {
			if cc.CanTakeNewStream() {
				return true
			}
		}
		return false
	})
	s, err := p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	streams = append(streams, s)
	if n := d.dials.Load(); n != 3 {
		t.Fatalf("%d dials, want still 3", n)
	}
	for _, s := range streams {
		s.Close()
	}
}

// TestPoolPeerStreamLimit: the server's SETTINGS_MAX_CONCURRENT_STREAMS
// caps a pooled connection below MaxStreamsPerConn.
func TestPoolPeerStreamLimit(t *testing.T) {
	ts := startServer(t, Config{MaxStreams: 1}, holdHandler, false)
	d := &countingDialer{ts: ts}
	p := suitePool(d.ts, PoolConfig{})
	defer p.Close()
	ctx := testContext(t)
	for range 3 {
		s, err := p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	if n := d.dials.Load(); n != 3 {
		t.Fatalf("%d dials, want 3", n)
	}
}

func TestPoolDialCoalescing(t *testing.T) {
	const callers = 20
	ts := startServer(t, Config{}, echoHandler, true)
	d := &countingDialer{ts: ts, gate: make(chan struct{})}
	p := suitePool(d.ts, PoolConfig{})
	defer p.Close()
	ctx := testContext(t)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			s, err := p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"})
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			echoRoundTrip(t, s, uint64(i), 100, 10)
		})
	}
	// Release the dial once every other caller waits on it.
	waitFor(t, "callers to queue behind the dial", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		k := p.keys["key"]
		return k != nil && k.dial != nil && k.dial.waiters == callers-1
	})
	close(d.gate)
	wg.Wait()
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials for %d concurrent Connects, want 1", n, callers)
	}
}

func TestPoolDialError(t *testing.T) {
	p := NewPool(PoolConfig{})
	defer p.Close()
	boom := errors.New("connection refused")
	var dials atomic.Int32
	_, err := p.Connect(testContext(t), "key", func(context.Context) (net.Conn, error) {
		dials.Add(1)
		return nil, boom
	}, &Request{Authority: "10.0.0.1:80"})
	if !errors.Is(err, boom) {
		t.Fatalf("Connect: %v", err)
	}
	if len(poolConns(p, "key")) != 0 {
		t.Error("failed dial left a connection")
	}
	p.mu.Lock()
	n := len(p.keys)
	p.mu.Unlock()
	if n != 0 {
		t.Errorf("%d keys after a failed dial", n)
	}
}

func TestPoolIdleRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startServerOver(t, Config{}, echoHandler, overPipe)
		d := &countingDialer{ts: ts}
		p := suitePool(d.ts, PoolConfig{IdleTimeout: 20e6})
		defer p.Close()
		ctx := testContext(t)
		s, err := p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"})
		if err != nil {
			t.Fatal(err)
		}
		conns := poolConns(p, "key")
		if len(conns) != 1 {
			t.Fatalf("%d connections", len(conns))
		}
		echoRoundTrip(t, s, 1, 1000, 100)
		s.Close()
		<-conns[0].Done()
		if err := conns[0].Err(); !errors.Is(err, errIdle) {
			t.Errorf("connection ended with %v, want idle release", err)
		}
		if n := len(poolConns(p, "key")); n != 0 {
			t.Fatalf("%d connections after idle release", n)
		}
		// The server saw a graceful close.
		if err := <-ts.serveErrs; err != nil {
			t.Errorf("ServeConn: %v", err)
		}
		s, err = p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if n := d.dials.Load(); n != 2 {
			t.Fatalf("%d dials, want 2", n)
		}
	})
}

// TestPoolGoAway: a server draining its connection lets the in-flight stream
// finish while the pool opens a new connection for new streams.
func TestPoolGoAway(t *testing.T) {
	draining := startServer(t, Config{}, echoHandler, true)
	fresh := startServer(t, Config{}, echoHandler, true)
	var dials atomic.Int32
	dial := func(ctx context.Context) (net.Conn, error) {
		if dials.Add(1) == 1 {
			return draining.dial(ctx)
		}
		return fresh.dial(ctx)
	}
	p := NewPool(PoolConfig{})
	defer p.Close()
	ctx := testContext(t)
	inflight, err := p.Connect(ctx, "key", dial, &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	defer inflight.Close()
	old := poolConns(p, "key")[0]

	shutdownErr := make(chan error, 1)
	go func() { shutdownErr <- draining.Shutdown(ctx) }()
	waitFor(t, "GOAWAY", func() bool { return !old.CanTakeNewStream() })

	s, err := p.Connect(ctx, "key", dial, &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	echoRoundTrip(t, s, 2, 1<<20, 16<<10)
	s.Close()
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials, want 2", n)
	}
	echoRoundTrip(t, inflight, 3, 1<<20, 16<<10)
	if err := <-shutdownErr; err != nil {
		t.Fatal(err)
	}
	<-old.Done()
}

func TestPoolClose(t *testing.T) {
	ts := startServer(t, Config{}, echoHandler, false)
	d := &countingDialer{ts: ts}
	p := suitePool(d.ts, PoolConfig{})
	ctx := testContext(t)
	s, err := p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("Read after pool Close: %v", err)
	}
	if _, err := p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"}); !errors.Is(err, ErrPoolClosed) {
		t.Fatalf("Connect after Close: %v", err)
	}
}

// TestPoolShutdown is a draining daemon's pool: GOAWAY on every
// connection, the open stream still carries bytes, the connection closes
// cleanly once it ends, and nothing new is dialled. A stream still open at
// the deadline is cut.
func TestPoolShutdown(t *testing.T) {
	ts := startServer(t, Config{}, echoHandler, false)
	d := &countingDialer{ts: ts}
	p := suitePool(d.ts, PoolConfig{})
	defer p.Close()
	ctx := testContext(t)
	s, err := p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	cc := poolConns(p, "key")[0]
	done := make(chan error, 1)
	go func() { done <- p.Shutdown(ctx) }()
	waitFor(t, "GOAWAY", func() bool { return !cc.CanTakeNewStream() })
	if _, err := p.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"}); !errors.Is(err, ErrPoolClosed) {
		t.Fatalf("Connect during Shutdown: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a stream open", err)
	case <-time.After(50 * time.Millisecond):
	}
	// The round trip ends the stream both ways (CloseWrite, the echo's
	// END_STREAM): the connection is drained.
	echoRoundTrip(t, s, 2, 256<<10, 16<<10)
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	<-cc.Done()
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials, want 1", n)
	}

	// The deadline passes with a stream open: Shutdown cuts it.
	p2 := suitePool(d.ts, PoolConfig{})
	defer p2.Close()
	held, err := p2.Connect(ctx, "key", d.dial, &Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := p2.Shutdown(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown past its deadline: %v, want DeadlineExceeded", err)
	}
	if _, err := held.Read(make([]byte, 1)); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("Read after a cut Shutdown: %v", err)
	}
}

func TestPoolStatusError(t *testing.T) {
	ts := startServer(t, Config{}, func(_ context.Context, req *ServerRequest) {
		_, _ = req.Respond(http.StatusServiceUnavailable, nil)
	}, false)
	d := &countingDialer{ts: ts}
	p := suitePool(d.ts, PoolConfig{})
	defer p.Close()
	for range 3 {
		_, err := p.Connect(testContext(t), "key", d.dial, &Request{Authority: "10.0.0.1:80"})
		var se *StatusError
		if !errors.As(err, &se) || se.Code != http.StatusServiceUnavailable {
			t.Fatalf("Connect: %v", err)
		}
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials, want 1: a non-200 must not poison the connection", n)
	}
}

// TestPoolIdleWithLiveStream is ztunnel's idle_eviction_with_persistent: a
// connection that still carries a stream outlives the idle timeout however
// long it runs, while one whose streams have all ended is released; once
// the last stream ends, it is released too. Eviction of the pool's other,
// later-idled connections (witnesses) shows the timeout has passed.
func TestPoolIdleWithLiveStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startServerOver(t, Config{}, echoHandler, overPipe)
		d := &countingDialer{ts: ts}
		p := suitePool(d.ts, PoolConfig{IdleTimeout: 50 * time.Millisecond, MaxStreamsPerConn: 4})
		defer p.Close()
		ctx := testContext(t)
		req := &Request{Authority: "10.0.0.1:80"}
		open := func(key string, n int) []*Stream {
			t.Helper()
			var ss []*Stream
			for range n {
				s, err := p.Connect(ctx, key, d.dial, req)
				if err != nil {
					t.Fatal(err)
				}
				ss = append(ss, s)
			}
			return ss
		}
		closeAll := func(ss []*Stream) {
			for _, s := range ss {
				s.Close()
			}
		}
		// witnessIdle idles a fresh connection of another key and waits until
		// the pool releases it: a full idle timeout has passed since now.
		witnessIdle := func() {
			t.Helper()
			key := fmt.Sprintf("witness-%d", d.dials.Load())
			closeAll(open(key, 1))
			w := poolConns(p, key)
			if len(w) != 1 {
				t.Fatalf("%d witness connections", len(w))
			}
			waitDone(t, w[0])
		}

		persistent := open("key", 1)[0]
		defer persistent.Close()
		closeAll(open("key", 2))
		conns := poolConns(p, "key")
		if len(conns) != 1 || d.dials.Load() != 1 {
			t.Fatalf("%d connections after %d dials, want 1 and 1", len(conns), d.dials.Load())
		}
		first := conns[0]
		for range 2 {
			witnessIdle()
		}
		select {
		case <-first.Done():
			t.Fatalf("the connection with a live stream was released: %v", first.Err())
		default:
		}
		// It still carries data (and stays open both ways).
		echoOnce(t, persistent, "echo on the live stream")

		// Four more: three fit beside the live stream, the fourth spills over
		// to a new connection, which is released once they end; the first is
		// not.
		spill := open("key", 4)
		conns = poolConns(p, "key")
		if len(conns) != 2 || d.dials.Load() != 4 { // two witnesses dialled too
			t.Fatalf("%d connections after %d dials, want 2 and 4", len(conns), d.dials.Load())
		}
		second := conns[0]
		if second == first {
			second = conns[1]
		}
		closeAll(spill)
		waitDone(t, second)
		if err := second.Err(); !errors.Is(err, errIdle) {
			t.Errorf("spill-over connection ended with %v, want idle release", err)
		}
		select {
		case <-first.Done():
			t.Fatalf("the connection with a live stream was released: %v", first.Err())
		default:
		}

		// The last stream ends: now the first goes too.
		persistent.Close()
		waitDone(t, first)
		if err := first.Err(); !errors.Is(err, errIdle) {
			t.Errorf("connection ended with %v, want idle release", err)
		}
		if n := len(poolConns(p, "key")); n != 0 {
			t.Fatalf("%d connections after idle release", n)
		}
	})
}

// waitDone waits, at most testTimeout, until c has ended.
func waitDone(t *testing.T, c *ClientConn) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(testTimeout):
		t.Fatal("the pooled connection was never released")
	}
}
