package hbone

import (
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// Tests of loop mode's seam itself; the protocol is the whole suite's, run
// loop-driven (TestMain). These drive their own loop, so they run once.

func onceOnly(t *testing.T) {
	t.Helper()
	if suiteDriver != byGoroutines {
		t.Skip("drives its own test loop: runs in the goroutine run only")
	}
}

// fromWaker records how a stream wakes it.
type fromWaker struct {
	loop  *testLoop
	wakes chan bool // Wake: false; WakeLocal on the loop: true
	from  chan any
}

func (w *fromWaker) Wake() {
	select {
	case w.wakes <- false:
	default:
	}
}

// wakeLocal is the test loop's WakeLocal of w from owner's callback.
func (w *fromWaker) wakeLocal(owner *loopEntry) {
	select {
	case w.from <- owner:
	default:
	}
	select {
	case w.wakes <- w.loop.inCall.Load():
	default:
	}
}

// drivenClient starts a ClientConn to ts driven by loop.
func drivenClient(t *testing.T, ts *testServer, loop *testLoop) *ClientConn {
	t.Helper()
	nc, err := ts.dial(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := NewClientConn(newLoopConn(nc.(*net.TCPConn)), Config{Drive: loop.drive})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestLoopStreamOwner: a loop-driven connection's streams report the
// loop's handle as their Owner and wake their Waker through its
// WakeLocal, from inside the loop's driver call; a goroutine-driven one
// reports none.
func TestLoopStreamOwner(t *testing.T) {
	onceOnly(t)
	ts := startServerOver(t, Config{}, echoHandler, overTCP)
	plain := connectStream(t, ts.client(t, Config{}))
	if o := plain.Owner(); o != nil {
		t.Fatalf("goroutine-driven stream: Owner %v, want nil", o)
	}

	loop := newTestLoop(t)
	s := connectStream(t, drivenClient(t, ts, loop))
	o := s.Owner()
	if _, ok := o.(*loopEntry); !ok {
		t.Fatalf("loop-driven stream: Owner %T, want the loop's *loopEntry", o)
	}
	w := &fromWaker{loop: loop, wakes: make(chan bool, 64), from: make(chan any, 64)}
	s.SetWaker(w)
	msg := []byte("over the loop")
	if _, err := s.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(msg))
	buf := make([]byte, 64)
	for len(got) < len(msg) {
		n, err := s.TryRead(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		if n > 0 {
			continue
		}
		select {
		case onLoop := <-w.wakes:
			if !onLoop {
				t.Fatal("the echo woke the stream by Wake or off the loop; want WakeLocal inside the driver call")
			}
		case <-time.After(testTimeout):
			t.Fatal("no wake-up for the echo")
		}
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo %q, want %q", got, msg)
	}
	select {
	case from := <-w.from:
		if from != o {
			t.Fatalf("WakeLocal of %v, want the stream's Owner %v", from, o)
		}
	default:
		t.Fatal("no WakeLocal")
	}
}

// TestLoopDriveRefused: a Drive that declines (ok=false) leaves the
// connection to its goroutines, and one whose transport lacks the fd-mode
// face is never offered.
func TestLoopDriveRefused(t *testing.T) {
	onceOnly(t)
	ts := startServerOver(t, Config{}, echoHandler, overTCP)
	offered := 0
	decline := func(net.Conn, Driven) (Owner, bool) {
		offered++
		return nil, false
	}
	for _, tc := range []struct {
		name    string
		wrap    bool
		offered int
	}{{"declined", true, 1}, {"no fd face", false, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			offered = 0
			nc, err := ts.dial(testContext(t))
			if err != nil {
				t.Fatal(err)
			}
			if tc.wrap {
				nc = newLoopConn(nc.(*net.TCPConn))
			}
			cc, err := NewClientConn(nc, Config{Drive: decline})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cc.Close() })
			s := connectStream(t, cc)
			echoOnce(t, s, tc.name)
			if s.Owner() != nil {
				t.Fatal("declined connection has an Owner")
			}
			if offered != tc.offered {
				t.Fatalf("Drive offered %d times, want %d", offered, tc.offered)
			}
		})
	}
}

// memTransport is a loopTransport over memory, for white-box tests of the
// turns: TryRead returns in (at most chunk bytes a call), then would
// block; the socket takes room bytes, the rest is held for TryFlush.
type memTransport struct {
	net.Conn // addresses for log lines; never read or written
	in       []byte
	chunk    int
	room     int
	out      []byte // what the "socket" took
	held     []byte
	closed   bool // TryClose ran
}

func (m *memTransport) TryRead(p []byte) (int, error) {
	if len(m.in) == 0 {
		return 0, errLoopWouldBlock
	}
	n := copy(p[:min(len(p), m.chunk)], m.in)
	m.in = m.in[n:]
	return n, nil
}

func (m *memTransport) Drained() bool { return len(m.in) == 0 }

func (m *memTransport) send() {
	n := min(m.room, len(m.held))
	m.out = append(m.out, m.held[:n]...)
	m.held = m.held[n:]
	m.room -= n
}

func (m *memTransport) TryWriteLent(p []byte) (ok, queued bool, err error) {
	m.held = append(m.held, p...)
	m.send()
	return true, len(m.held) > 0, nil
}

func (m *memTransport) TryFlush() (bool, error) {
	m.send()
	return len(m.held) == 0, nil
}

func (m *memTransport) TryClose() bool {
	m.closed = true
	return len(m.held) == 0
}

// nopOwner counts what the connection asks of its loop.
type nopOwner struct{ starts, wakes, closes int }

func (o *nopOwner) Start()     { o.starts++ }
func (o *nopOwner) Wake()      { o.wakes++ }
func (o *nopOwner) Close(bool) { o.closes++ }

func (o *nopOwner) WakeLocal(w interface{ Wake() }) { w.Wake() }

// TestLoopTurns drives a server connection's turns by hand: a read turn
// stops after its frame budget with more=true and the next goes on where
// it stopped; Flush writes what the frames provoked, holding what the
// socket refuses, and Writable sends the rest in order as room comes.
func TestLoopTurns(t *testing.T) {
	onceOnly(t)
	const pings = 5*loopFrameBudget + 3
	var in []byte
	in = append(in, http2.ClientPreface...)
	in = appendSettings(in, nil)
	for i := range pings {
		in = appendPing(in, false, [8]byte{byte(i)})
	}
	a, b := net.Pipe()
	t.Cleanup(func() { _, _ = a.Close(), b.Close() })
	m := &memTransport{Conn: a, in: in, chunk: 100}
	c := newConn(m, Config{}.withDefaults(true), false)
	o := &nopOwner{}
	d := testDriven(c, o)

	turns := 0
	for more := true; more; turns++ {
		var err error
		if more, err = d.Readable(); err != nil {
			t.Fatal(err)
		}
		if turns > pings {
			t.Fatal("read turns do not end")
		}
	}
	if want := pings/loopFrameBudget + 1; turns < want {
		t.Fatalf("%d read turns for %d frames, want at least %d (budget %d frames a turn)", turns, pings+1, want, loopFrameBudget)
	}
	if len(m.in) != 0 {
		t.Fatalf("%d bytes left unread", len(m.in))
	}

	m.room = 20 // less than the first frame: everything is held
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		if len(m.held) == 0 && d.out == nil && c.pendingLenLocked() == 0 {
			break
		}
		m.room = 37 // odd, so frames are cut anywhere
		if _, err := d.Writable(); err != nil {
			t.Fatal(err)
		}
	}
	fr := http2.NewFramer(nil, bytes.NewReader(m.out))
	var acks []byte
	settings := 0
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		switch f := f.(type) {
		case *http2.PingFrame:
			if !f.IsAck() {
				t.Fatalf("PING %v, want acknowledgements only", f.Data)
			}
			acks = append(acks, f.Data[0])
		case *http2.SettingsFrame:
			settings++
		}
	}
	if settings != 2 { // ours, and the ACK of the peer's
		t.Fatalf("%d SETTINGS frames, want 2", settings)
	}
	if len(acks) != pings {
		t.Fatalf("%d PING acknowledgements, want %d", len(acks), pings)
	}
	for i, v := range acks {
		if v != byte(i) {
			t.Fatalf("acknowledgement %d is for PING %d: out of order", i, v)
		}
	}
	if o.starts != 1 {
		// Start's Flush covers what the read turns committed before it.
		t.Fatalf("Start called %d times, want 1", o.starts)
	}
	c.shutdown(ErrConnClosed, false, 0, "", false)
	if _, err := d.Writable(); err != nil {
		t.Fatal(err)
	}
	if !m.closed || o.closes != 1 {
		t.Fatalf("after shutdown: TryClose ran %v, Close asked %d times; want true, 1", m.closed, o.closes)
	}
	d.Ended(nil)
	select {
	case <-c.done:
	default:
		t.Fatal("Done not closed after Ended")
	}
}

// testDriven makes c loop-driven by hand (its transport must be a
// loopTransport), owned by o, and returns its driver.
func testDriven(c *conn, o Owner) *loopDriver {
	l := &loopDriver{c: c, lt: c.nc.(loopTransport), own: o, flushAsked: true}
	c.drv = l
	o.Start()
	return l
}
