package engine_test

import (
	"errors"
	"io"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// takeFake is startFake without the Start: the handle exists, the loop
// does not have the connection yet.
func takeFake(t *testing.T, e *engine.Engine, d *fakeDriver) (*engine.ConnHandle, *net.TCPConn) {
	t.Helper()
	tc, peer := nettest.TCPPair(t)
	h, err := e.TakeConn(tc, d, d.bind)
	if err != nil {
		t.Fatal(err)
	}
	d.h.Store(h)
	_ = peer.SetDeadline(time.Now().Add(hangLimit))
	return h, peer
}

// TestConnBeforeStart: what a handle is asked before Start is done once
// the loop has the connection, exactly once: a Close ends it without a
// read turn (graceful: the bytes committed before go out first; abort:
// a reset), and a Wake's Flush comes after the first read turn.
func TestConnBeforeStart(t *testing.T) {
	tests := []struct {
		name      string
		before    func(d *fakeDriver, h *engine.ConnHandle)
		peer      func(t *testing.T, peer *net.TCPConn)
		ended     error
		readables int64
	}{
		{"close", func(d *fakeDriver, h *engine.ConnHandle) {
			d.commit([]byte("bye"))
			h.Close(false)
		}, func(t *testing.T, peer *net.TCPConn) {
			if got, err := io.ReadAll(peer); err != nil || string(got) != "bye" {
				t.Fatalf("peer read %q, %v; want bye then EOF", got, err)
			}
			peer.Close()
		}, nil, 0},
		{"abort", func(d *fakeDriver, h *engine.ConnHandle) {
			d.commit([]byte("dropped"))
			h.Close(false)
			h.Close(true) // cuts the graceful one short
		}, func(t *testing.T, peer *net.TCPConn) {
			if got, err := io.ReadAll(peer); !errors.Is(err, syscall.ECONNRESET) || len(got) != 0 {
				t.Fatalf("peer read %q, %v; want ECONNRESET", got, err)
			}
		}, engine.ErrAborted, 0},
		{"wake", func(d *fakeDriver, _ *engine.ConnHandle) {
			d.commit([]byte("hello"))
		}, func(t *testing.T, peer *net.TCPConn) {
			if got := readN(t, peer, 5); got != "hello" {
				t.Fatalf("peer read %q, want hello", got)
			}
			peer.Close() // Readable reads the EOF: the connection ends
		}, io.EOF, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEpoll(t, 1)
			d := newFakeDriver()
			h, peer := takeFake(t, e, d)
			tc.before(d, h)
			h.Start()
			tc.peer(t, peer)
			d.wantEnded(t, tc.ended)
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-d.ended:
				t.Fatalf("Ended called twice, again with %v", err)
			default:
			}
			if got := d.readables.Load(); got != tc.readables {
				t.Fatalf("%d read turns, want %d", got, tc.readables)
			}
		})
	}
}

// TestConnCloseWaitsForStart: an engine's Close counts a taken handle
// as a connection and waits for its Start, which ends it: Ended(ErrClosed),
// the socket closed.
func TestConnCloseWaitsForStart(t *testing.T) {
	e := newEpoll(t, 1)
	d := newFakeDriver()
	h, peer := takeFake(t, e, d)
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	h.Start()
	d.wantEnded(t, engine.ErrClosed)
	if _, err := io.ReadAll(peer); err != nil {
		t.Fatalf("peer read %v, want EOF", err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangLimit):
		t.Fatal("Close did not return after Start")
	}
}

// TestConnIdleLoopSleeps: a loop whose connections are idle waits without
// a wake-up (no clock of its own for them): no wait returns over 3 s.
func TestConnIdleLoopSleeps(t *testing.T) {
	e := newEpoll(t, 1)
	for range 3 {
		d := newFakeDriver()
		peer := startFake(t, e, d, nil)
		peer.Write([]byte("x"))
		if !nettest.Until(hangLimit, func() bool { return slices.Contains(d.logged(), "Rx") }) {
			t.Fatal("the connection's input was not read")
		}
	}
	before := engine.LoopWaits(e)
	time.Sleep(3 * time.Second) // the window in which nothing may happen
	if n := engine.LoopWaits(e) - before; n != 0 {
		t.Fatalf("an idle loop with 3 connections returned from %d waits in 3 s, want 0", n)
	}
}
