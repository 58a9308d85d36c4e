package engine

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
)

// TestHandOffDetachFails: when an event-loop engine cannot take one of the
// two sockets over, both peers see a reset at once (not a connection left
// open until garbage collection) and the relay ends with the takeover's
// error.
func TestHandOffDetachFails(t *testing.T) {
	fault := errors.New("injected takeover failure")
	for _, backend := range []string{BackendEpoll, BackendUring} {
		for _, tc := range []struct {
			name  string
			failB bool // the takeover of B fails, after A's succeeded
		}{
			{"FirstSocket", false},
			{"SecondSocket", true},
		} {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				e, err := New(Config{Backend: backend})
				if err != nil {
					if backend == BackendUring {
						t.Skipf("io_uring backend unavailable here: %v", err)
					}
					t.Fatal(err)
				}
				defer e.Close()
				client, a := loopbackPair(t)
				b, server := loopbackPair(t)
				victim := a
				if tc.failB {
					victim = b
				}
				e.detachFault = func(c *net.TCPConn) error {
					if c == victim {
						return fault
					}
					return nil
				}
				done := make(chan Result, 1)
				h := e.Start(TCPEndpoint{a}, TCPEndpoint{b}, nil, func(r Result) { done <- r })
				for _, peer := range []struct {
					name string
					c    *net.TCPConn
				}{{"client", client}, {"server", server}} {
					// loopbackPair's deadline is only the safety net:
					// the reset is due at once.
					if _, err := io.ReadAll(peer.c); !errors.Is(err, syscall.ECONNRESET) {
						t.Errorf("%s read %v, want ECONNRESET", peer.name, err)
					}
				}
				if res := <-done; !errors.Is(res.Err, fault) {
					t.Errorf("relay ended with %v, want the takeover's error", res.Err)
				}
				if !h.Done() {
					t.Error("handle not done after the result")
				}
			})
		}
	}
}
