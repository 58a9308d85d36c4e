package engine

import (
	"errors"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestWatchReadable: sockets handed to the engine's watcher are served by
// one goroutine, however many there are: a listener's ready function runs
// once per queued connection, a UDP socket's once per datagram, a delay it
// returns leaves the socket alone that long, and after stop it never runs
// again, while the socket's readiness goes on.
func TestWatchReadable(t *testing.T) {
	eng, err := New(Config{Backend: BackendStd})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	const listeners = 50
	before := runtime.NumGoroutine()
	type watched struct {
		ln       *net.TCPListener
		accepted chan *net.TCPConn
		stop     func()
	}
	var lns []*watched
	for range listeners {
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		w := &watched{ln: ln, accepted: make(chan *net.TCPConn, 8)}
		rc, err := ln.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		w.stop, err = eng.WatchReadable(rc, func() time.Duration {
			c, err := ln.AcceptTCP()
			if err != nil {
				t.Errorf("accept: %v", err)
				return time.Second
			}
			w.accepted <- c
			return 0
		})
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, w)
	}
	if added := runtime.NumGoroutine() - before; added > 1 {
		t.Errorf("%d watched listeners added %d goroutines, want at most 1 (the watcher)", listeners, added)
	}
	// Three connections queued at once on every listener: each accepted.
	for _, w := range lns {
		for range 3 {
			c, err := net.Dial("tcp", w.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
		}
	}
	for i, w := range lns {
		for range 3 {
			select {
			case c := <-w.accepted:
				c.Close()
			case <-time.After(10 * time.Second):
				t.Fatalf("listener %d: a queued connection was not accepted", i)
			}
		}
	}

	// A UDP socket whose ready function asks to be left alone after each
	// datagram: the second of two sent together is read only after that.
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	rc, err := pc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	const pause = 200 * time.Millisecond
	reads := make(chan time.Time, 4)
	var calls atomic.Int32
	stopUDP, err := eng.WatchReadable(rc, func() time.Duration {
		calls.Add(1)
		buf := make([]byte, 16)
		_ = pc.SetReadDeadline(time.Now().Add(time.Second))
		if _, _, err := pc.ReadFrom(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read: %v", err)
		}
		reads <- time.Now()
		return pause
	})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := net.DialUDP("udp", nil, pc.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for range 2 {
		if _, err := cl.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
	}
	first, second := <-reads, <-reads
	if gap := second.Sub(first); gap < pause {
		t.Errorf("second datagram read %v after the first, want at least the %v the ready function asked for", gap, pause)
	}

	// Stopped: a third datagram stays unread by the watcher.
	stopUDP()
	n := calls.Load()
	if _, err := cl.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := pc.ReadFrom(buf); err != nil {
		t.Fatalf("the datagram sent after stop: %v", err)
	}
	if got := calls.Load(); got != n {
		t.Errorf("ready ran %d times after stop", got-n)
	}
	for _, w := range lns {
		w.stop()
	}
}
