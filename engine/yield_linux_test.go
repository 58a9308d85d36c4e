package engine_test

import (
	"io"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// TestBlockingLoopYields relays round trips through an epoll loop that
// blocks its goroutine in epoll_wait (a TCP⇄TCP loop; every loop with
// LockOSThread) for longer than a few blockingYieldEvery, and checks that
// the loop passed through the scheduler meanwhile: a goroutine that only
// runs and sits in syscalls looks to the runtime's sysmon like one running
// for ever, which retakes its P and then wakes every 20 µs (issue 36).
func TestBlockingLoopYields(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  engine.Config
	}{
		{"blocking TCP loop", engine.Config{Backend: engine.BackendEpoll, Loops: 1}},
		{"locked OS thread", engine.Config{Backend: engine.BackendEpoll, Loops: 1, LockOSThread: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := engine.New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			client, a := nettest.TCPPair(t)
			b, server := nettest.TCPPair(t)
			done := make(chan engine.Result, 1)
			e.Start(engine.TCPEndpoint{TCPConn: a}, engine.TCPEndpoint{TCPConn: b}, nil, func(r engine.Result) { done <- r })
			one := make([]byte, 1)
			deadline := time.Now().Add(20 * time.Second)
			rts := 0
			// Round trips until the loop has yielded a few times: each
			// wake-up of the loop reads its clock, and a yield is due
			// every 4 ms of it.
			for engine.LoopYields(e) < 3 {
				if time.Now().After(deadline) {
					t.Fatalf("%d round trips over 20 s and the loop yielded %d times", rts, engine.LoopYields(e))
				}
				if _, err := client.Write(one); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(server, one); err != nil {
					t.Fatal(err)
				}
				if _, err := server.Write(one); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(client, one); err != nil {
					t.Fatal(err)
				}
				rts++
			}
			client.CloseWrite()
			server.CloseWrite()
			if r := <-done; r.Err != nil {
				t.Fatalf("relay ended with %v", r.Err)
			}
		})
	}
}
