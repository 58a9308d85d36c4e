package dnsproxy

import (
	"errors"
	"log/slog"
	"net"
	"testing"
	"testing/synctest"
	"time"
)

// TestPauseBackoff: a failing read or accept waits 5 ms, doubling up to 1 s;
// a closed socket or a stopping server ends the loop at once.
func TestPauseBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &Server{log: slog.New(slog.DiscardHandler), stop: make(chan struct{})}
		addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}
		failed := errors.New("too many open files")
		var backoff time.Duration
		for _, want := range []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000} {
			start := time.Now()
			if !s.pause(&backoff, "DNS accept failed", addr, failed) {
				t.Fatal("pause ended the loop on a transient error")
			}
			if got := time.Since(start); got != want*time.Millisecond {
				t.Fatalf("waited %v, want %v", got, want*time.Millisecond)
			}
		}
		if s.pause(&backoff, "DNS accept failed", addr, net.ErrClosed) {
			t.Error("pause went on after the socket closed")
		}
		go func() {
			time.Sleep(100 * time.Millisecond)
			close(s.stop)
		}()
		start := time.Now()
		if s.pause(&backoff, "DNS accept failed", addr, failed) || time.Since(start) != 100*time.Millisecond {
			t.Errorf("pause did not end when the server stopped (after %v)", time.Since(start))
		}
	})
}
