package engine_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/engine/enginetest"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"golang.org/x/sys/unix"
)

// fakeDriver is a ConnDriver over a plain TCP socket: what it reads is
// logged, what tests commit goes out in its Flush (and Writable), and it
// can be told to wake itself, fail, spin or stall.
type fakeDriver struct {
	fd int
	h  atomic.Pointer[engine.ConnHandle]

	wakesPerRead int  // Wakes per Readable that read data (a commit burst)
	busy         bool // Readable always says more (a connection that never drains)
	failOn       byte // Readable fails on reading this byte (0: never)
	stall        atomic.Bool

	readables atomic.Int64

	mu     sync.Mutex // guards the following fields
	log    []string   // "R<bytes>" for a Readable that read, "F" for a Flush
	out    []byte     // committed, not yet flushed
	unsent []byte     // flushed, refused by the socket so far (loop only)

	ended chan error
}

var errDriverFail = errors.New("driver: protocol error")

func newFakeDriver() *fakeDriver { return &fakeDriver{fd: -1, ended: make(chan error, 1)} }

func (d *fakeDriver) bind(fd int) error { d.fd = fd; return nil }

func (d *fakeDriver) Readable() (bool, error) {
	d.readables.Add(1)
	if d.stall.Swap(false) {
		time.Sleep(5 * time.Millisecond)
	}
	buf := make([]byte, 4096)
	for {
		n, err := unix.Read(d.fd, buf)
		if err == unix.EAGAIN {
			return d.busy, nil
		}
		if err != nil {
			return false, err
		}
		if n == 0 {
			return false, io.EOF
		}
		d.mu.Lock()
		d.log = append(d.log, "R"+string(buf[:n]))
		d.mu.Unlock()
		for range d.wakesPerRead {
			d.h.Load().Wake()
		}
		if d.failOn != 0 && bytes.IndexByte(buf[:n], d.failOn) >= 0 {
			return false, errDriverFail
		}
	}
}

func (d *fakeDriver) write() (bool, error) {
	for len(d.unsent) > 0 {
		k, err := unix.Write(d.fd, d.unsent)
		if err == unix.EAGAIN {
			return true, nil
		}
		if err != nil {
			return true, err
		}
		d.unsent = d.unsent[k:]
	}
	return false, nil
}

func (d *fakeDriver) Writable() (bool, error) { return d.write() }

func (d *fakeDriver) Flush() error {
	d.mu.Lock()
	d.log = append(d.log, "F")
	d.unsent = append(d.unsent, d.out...)
	d.out = d.out[:0]
	d.mu.Unlock()
	_, err := d.write()
	return err
}

func (d *fakeDriver) Ended(err error) { d.ended <- err }

// commit queues p for the next Flush and wakes the connection, from any
// goroutine.
func (d *fakeDriver) commit(p []byte) {
	d.mu.Lock()
	d.out = append(d.out, p...)
	d.mu.Unlock()
	d.h.Load().Wake()
}

func (d *fakeDriver) logged() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.log...)
}

// wantEnded waits for Ended and checks its error.
func (d *fakeDriver) wantEnded(t *testing.T, want error) {
	t.Helper()
	select {
	case err := <-d.ended:
		if !errors.Is(err, want) && err != want {
			t.Fatalf("Ended(%v), want %v", err, want)
		}
	case <-time.After(hangLimit):
		t.Fatal("Ended was not called")
	}
}

func newEpoll(t *testing.T, loops int) *engine.Engine {
	t.Helper()
	e, err := engine.New(engine.Config{Backend: engine.BackendEpoll, Loops: loops})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// startFake puts a fakeDriver on e over a fresh loopback connection and
// returns the driver and the peer's end.
func startFake(t *testing.T, e *engine.Engine, d *fakeDriver, tune func(tc, peer *net.TCPConn)) *net.TCPConn {
	t.Helper()
	tc, peer := nettest.TCPPair(t)
	if tune != nil {
		tune(tc, peer)
	}
	h, err := e.TakeConn(tc, d, d.bind)
	if err != nil {
		t.Fatal(err)
	}
	d.h.Store(h)
	h.Start()
	_ = peer.SetDeadline(time.Now().Add(hangLimit))
	return peer
}

func readN(t *testing.T, c *net.TCPConn, n int) string {
	t.Helper()
	buf := make([]byte, n)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	return string(buf)
}

// TestTakeConnUnsupported: std and uring refuse loop-owned connections
// with ErrUnsupported and leave the connection to the caller, who can
// still use it (the goroutine fallback).
func TestTakeConnUnsupported(t *testing.T) {
	for _, name := range []string{engine.BackendStd, engine.BackendUring} {
		t.Run(name, func(t *testing.T) {
			e, err := engine.New(engine.Config{Backend: name})
			if err != nil {
				t.Skipf("%s unavailable: %v", name, err)
			}
			defer e.Close()
			tc, peer := nettest.TCPPair(t)
			d := newFakeDriver()
			h, err := e.TakeConn(tc, d, d.bind)
			if !errors.Is(err, engine.ErrUnsupported) || !errors.Is(err, errors.ErrUnsupported) || h != nil {
				t.Fatalf("TakeConn = %v, %v; want ErrUnsupported", h, err)
			}
			if d.fd != -1 || d.readables.Load() != 0 {
				t.Fatal("bind or the driver ran although TakeConn failed")
			}
			_ = peer.SetDeadline(time.Now().Add(hangLimit))
			if _, err := tc.Write([]byte("still mine")); err != nil {
				t.Fatal(err)
			}
			if got := readN(t, peer, 10); got != "still mine" {
				t.Fatalf("peer read %q", got)
			}
		})
	}
}

// TestConnFlushCoalesces: the 100 Wakes a Readable makes (a burst of
// commits) cost exactly one Flush, at the end of the iteration, before
// the next Readable; a Wake from another goroutine gets one too.
func TestConnFlushCoalesces(t *testing.T) {
	e := newEpoll(t, 1)
	d := newFakeDriver()
	d.wakesPerRead = 100
	peer := startFake(t, e, d, nil)
	lastIsFlush := func() bool {
		log := d.logged()
		return len(log) > 0 && log[len(log)-1] == "F"
	}
	// The add's own turn: a read (nothing yet) and a Flush.
	for !lastIsFlush() {
		runtime.Gosched()
	}
	for _, msg := range []string{"a", "b", "c"} {
		if _, err := peer.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		// Each message is sent once the previous burst's Flush ran, so
		// each is read by a Readable of its own.
		for !strings.HasSuffix(strings.Join(d.logged(), ","), "R"+msg+",F") {
			runtime.Gosched()
		}
	}
	d.commit([]byte("z"))
	if got := readN(t, peer, 1); got != "z" {
		t.Fatalf("peer read %q after a foreign commit", got)
	}
	if !lastIsFlush() {
		t.Fatal("a foreign Wake's bytes went out without a Flush")
	}
	if got, want := strings.Join(d.logged(), ","), "F,Ra,F,Rb,F,Rc,F,F"; got != want {
		t.Fatalf("log %s, want %s", got, want)
	}
	if st := e.Stats(); st.Conns != 1 {
		t.Fatalf("stats: %d conns, want 1", st.Conns)
	}
}

// TestConnReadableRequeuedFairly: a connection whose Readable always has
// more does not starve another connection of the same loop.
func TestConnReadableRequeuedFairly(t *testing.T) {
	e := newEpoll(t, 1)
	busy := newFakeDriver()
	busy.busy = true
	startFake(t, e, busy, nil)
	echo := enginetest.NewMuxEcho(t, e, enginetest.MuxOptions{})
	before := busy.readables.Load()
	for i := range 10 {
		echo.RoundTrip(t, []byte{byte(i)})
	}
	if busy.readables.Load() <= before {
		t.Fatal("the busy connection got no turn while the other ran")
	}
	busy.h.Load().Close(true)
	busy.wantEnded(t, engine.ErrAborted)
}

// TestConnCloseGracefulAndAbort: Close(false) sends what the driver
// holds (through Writable when the socket is full), then the FIN, and
// ends clean once the peer closes; Close(true) resets; a Readable error
// closes gracefully and reports the error; Engine.Close ends with
// ErrClosed.
func TestConnCloseGracefulAndAbort(t *testing.T) {
	big := bytes.Repeat([]byte("held until the socket drains "), 1<<20/29)
	tests := []struct {
		name   string
		failOn byte
		run    func(t *testing.T, e *engine.Engine, d *fakeDriver, peer *net.TCPConn)
	}{
		{"graceful", 0, func(t *testing.T, e *engine.Engine, d *fakeDriver, peer *net.TCPConn) {
			d.commit([]byte("bye"))
			d.h.Load().Close(false)
			if got, err := io.ReadAll(peer); err != nil || string(got) != "bye" {
				t.Fatalf("peer read %q, %v; want bye then EOF", got, err)
			}
			peer.Close()
			d.wantEnded(t, nil)
		}},
		{"graceful-held", 0, func(t *testing.T, e *engine.Engine, d *fakeDriver, peer *net.TCPConn) {
			d.commit(big)
			d.h.Load().Close(false)
			got, err := io.ReadAll(peer)
			if err != nil || !bytes.Equal(got, big) {
				t.Fatalf("peer read %d bytes, %v; want %d then EOF", len(got), err, len(big))
			}
			peer.Close()
			d.wantEnded(t, nil)
		}},
		{"abort", 0, func(t *testing.T, e *engine.Engine, d *fakeDriver, peer *net.TCPConn) {
			d.h.Load().Close(true)
			if _, err := io.ReadAll(peer); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("peer read %v, want ECONNRESET", err)
			}
			d.wantEnded(t, engine.ErrAborted)
			d.h.Load().Close(false) // after the end: nothing
		}},
		{"readable-error", 'x', func(t *testing.T, e *engine.Engine, d *fakeDriver, peer *net.TCPConn) {
			peer.Write([]byte("x"))
			if got, err := io.ReadAll(peer); err != nil || len(got) != 0 {
				t.Fatalf("peer read %q, %v; want EOF", got, err)
			}
			peer.Close()
			d.wantEnded(t, errDriverFail)
		}},
		{"linger", 0, func(t *testing.T, e *engine.Engine, d *fakeDriver, peer *net.TCPConn) {
			// The peer reads the FIN but neither closes nor stops
			// sending: the engine discards its bytes and closes after
			// the linger, and the close was still clean.
			d.h.Load().Close(false)
			if _, err := io.ReadAll(peer); err != nil {
				t.Fatal(err)
			}
			peer.Write([]byte("ignored"))
			d.wantEnded(t, nil)
		}},
		{"flush-timeout", 0, func(t *testing.T, e *engine.Engine, d *fakeDriver, peer *net.TCPConn) {
			// The peer reads nothing: the held bytes never go out, and
			// the flush's bound resets the connection.
			d.commit(big)
			d.h.Load().Close(false)
			select {
			case err := <-d.ended:
				if err == nil || !strings.Contains(err.Error(), "flush timed out") {
					t.Fatalf("Ended(%v), want the flush timeout", err)
				}
			case <-time.After(hangLimit):
				t.Fatal("Ended was not called")
			}
			if _, err := io.ReadAll(peer); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("peer read %v, want ECONNRESET", err)
			}
		}},
		{"engine-close", 0, func(t *testing.T, e *engine.Engine, d *fakeDriver, peer *net.TCPConn) {
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			d.wantEnded(t, engine.ErrClosed)
			if st := e.Stats(); st.Conns != 0 {
				t.Fatalf("stats after Close: %d conns", st.Conns)
			}
			if _, err := io.ReadAll(peer); err != nil {
				t.Fatalf("peer read %v, want EOF", err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEpoll(t, 1)
			d := newFakeDriver()
			d.failOn = tc.failOn
			// Small buffers: the held test's bytes do not fit at once.
			peer := startFake(t, e, d, func(tc, peer *net.TCPConn) {
				_ = tc.SetWriteBuffer(32 << 10)
				_ = peer.SetReadBuffer(32 << 10)
			})
			tc.run(t, e, d, peer)
		})
	}
}

// TestConnDrainWaits: Drain counts loop-owned connections like relays.
func TestConnDrainWaits(t *testing.T) {
	e := newEpoll(t, 1)
	d := newFakeDriver()
	peer := startFake(t, e, d, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// A drain whose time is up closes the engine: Ended(ErrClosed).
	e2 := newEpoll(t, 1)
	d2 := newFakeDriver()
	startFake(t, e2, d2, nil)
	if err := e2.Drain(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain = %v, want context.Canceled", err)
	}
	d2.wantEnded(t, engine.ErrClosed)
	// A drain with time waits for the connection to end.
	drained := make(chan error, 1)
	go func() { drained <- e.Drain(context.Background()) }()
	d.h.Load().Close(false)
	if _, err := io.ReadAll(peer); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	d.wantEnded(t, nil)
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("Drain = %v", err)
		}
	case <-time.After(hangLimit):
		t.Fatal("Drain did not return after the connection ended")
	}
}

// TestConnStalls: a driver call over 1 ms counts as a stall.
func TestConnStalls(t *testing.T) {
	e := newEpoll(t, 1)
	d := newFakeDriver()
	peer := startFake(t, e, d, nil)
	d.stall.Store(true)
	before := e.Stats().ConnStalls
	peer.Write([]byte("s"))
	if !nettest.Until(hangLimit, func() bool { return e.Stats().ConnStalls != before }) {
		t.Fatal("a 5 ms Readable was not counted as a stall")
	}
}

// TestConnWakeLocalAndForeign: a Mux whose stream's relay is on its
// connection's loop readies the relay directly (Stats.LocalWakes); with
// the relay on another loop the same WakeLocal is a Wake, and the bytes
// still go through.
func TestConnWakeLocalAndForeign(t *testing.T) {
	for _, tc := range []struct {
		name  string
		loops int
		opt   enginetest.MuxOptions
		local bool
	}{
		{"local", 1, enginetest.MuxOptions{}, true},
		// Two stream loops: the relay still goes to its home's.
		{"placed-home", 2, enginetest.MuxOptions{}, true},
		// Two stream loops, round-robin from a fresh engine: the
		// connection on one, the relay (no Home) on the other.
		{"foreign", 2, enginetest.MuxOptions{NoHome: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEpoll(t, tc.loops)
			echo := enginetest.NewMuxEcho(t, e, tc.opt)
			for i := range 20 {
				echo.RoundTrip(t, bytes.Repeat([]byte{byte(i)}, 1+i*1000))
			}
			echo.End(t)
			if got := e.Stats().LocalWakes; (got > 0) != tc.local {
				t.Fatalf("LocalWakes = %d, want local wake-ups: %v", got, tc.local)
			}
		})
	}
}

// TestConnEndsEveryGoroutine: loop-owned connections and their relays
// leave nothing once the engine is closed.
func TestConnEndsEveryGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	e, err := engine.New(engine.Config{Backend: engine.BackendEpoll, Loops: 1})
	if err != nil {
		t.Fatal(err)
	}
	var echoes []*enginetest.MuxEcho
	for range 5 {
		echo := enginetest.NewMuxEcho(t, e, enginetest.MuxOptions{})
		echo.RoundTrip(t, []byte("x"))
		echoes = append(echoes, echo)
	}
	d := newFakeDriver()
	startFake(t, e, d, nil)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	d.wantEnded(t, engine.ErrClosed)
	for _, echo := range echoes {
		echo.WaitEnded(t)
	}
	got := runtime.NumGoroutine()
	if !nettest.Until(hangLimit, func() bool { got = runtime.NumGoroutine(); return got <= before }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Close, %d before:\n%s", got, before, buf[:runtime.Stack(buf, true)])
	}
}

// TestConnCommitsCostNoWakeup: round trips through a loop-owned Mux make
// no Poller.Wake at all: the relay's commits and the driver's own are
// made on the loop (connOnLoop), the Flush runs at the end of the
// iteration, and nothing crosses a goroutine.
func TestConnCommitsCostNoWakeup(t *testing.T) {
	e := newEpoll(t, 1)
	x := enginetest.NewMuxFrameEcho(t, e, enginetest.MuxOptions{})
	x.RoundTrip(t, []byte("up"))
	before := engine.PollerWakes(e)
	for i := range 100 {
		x.RoundTrip(t, []byte{byte(i)})
	}
	if n := engine.PollerWakes(e) - before; n != 0 {
		t.Fatalf("100 round trips sent the loop %d wake-ups, want none", n)
	}
	x.End(t)
}

// TestConnSlowStreamDoesNotStallItsConnection: two streams of one
// loop-owned Mux; the first one's client reads nothing while its server
// pushes far more than the stream's window, and the second stream's round
// trips still go through: the stalled stream withholds its own window,
// never the connection's reads.
func TestConnSlowStreamDoesNotStallItsConnection(t *testing.T) {
	e := newEpoll(t, 1)
	var servers [2]*net.TCPConn
	var bridged [2]*net.TCPConn
	for i := range servers {
		bridged[i], servers[i] = nettest.TCPPair(t)
		_ = servers[i].SetDeadline(time.Now().Add(hangLimit))
	}
	mc, rc := nettest.TCPPair(t)
	m, err := enginetest.NewMux(e, mc, enginetest.MuxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	enginetest.NewMuxPeer(rc, func(id uint32) *net.TCPConn { return bridged[id-1] })
	var clients [2]*net.TCPConn
	for i := range clients {
		c, a := nettest.TCPPair(t)
		_ = c.SetDeadline(time.Now().Add(hangLimit))
		clients[i] = c
		e.Start(engine.TCPEndpoint{TCPConn: a}, m.Open(), nil, nil)
	}
	// The slow stream: its server writes until its socket is full, the
	// relay's client socket full and the stream's window spent.
	pushed := make(chan int64, 1)
	go func() {
		// Each write gets its own 200 ms: the socket is full when one
		// cannot complete in that time, however late a loaded machine
		// schedules this goroutine (one deadline for the whole copy left a
		// starved goroutine 0 bytes).
		chunk := make([]byte, 32<<10)
		var n int64
		for n < 64<<20 {
			_ = servers[0].SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			w, err := servers[0].Write(chunk)
			n += int64(w)
			if err != nil {
				break
			}
		}
		pushed <- n
	}()
	if n := <-pushed; n < 2*enginetest.MuxWindow {
		t.Fatalf("the slow stream's server pushed only %d bytes", n)
	}
	// The other stream of the same connection answers at once.
	go io.Copy(servers[1], servers[1])
	for i := range 10 {
		msg := []byte{byte(i)}
		if _, err := clients[1].Write(msg); err != nil {
			t.Fatal(err)
		}
		if got := readN(t, clients[1], 1); got != string(msg) {
			t.Fatalf("round trip %d read %q", i, got)
		}
	}
	if st := e.Stats(); st.Conns != 1 || st.LoopRelays != 2 {
		t.Fatalf("stats %+v: want 1 connection, 2 relays", st)
	}
}
