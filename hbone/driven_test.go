package hbone

import (
	"bytes"
	"net"
	"testing"
	"time"
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
	wakes chan bool // Wake: false; WakeFrom on the loop: true
	from  chan any
}

func (w *fromWaker) Wake() {
	select {
	case w.wakes <- false:
	default:
	}
}

func (w *fromWaker) WakeFrom(owner any) {
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
// loop's handle as their Owner and wake a Waker that can take it by
// WakeFrom(owner), from inside the loop's driver call; a goroutine-driven
// one reports none.
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
				t.Fatal("the echo woke the stream by Wake or off the loop; want WakeFrom inside the driver call")
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
			t.Fatalf("WakeFrom(%v), want the stream's Owner %v", from, o)
		}
	default:
		t.Fatal("no WakeFrom")
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
