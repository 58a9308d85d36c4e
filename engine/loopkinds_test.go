package engine_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/engine/enginetest"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// waitStats polls e.Stats until ok holds; the deadline is only a safety net
// against a hang.
func waitStats(t *testing.T, e *engine.Engine, what string, ok func(engine.Stats) bool) {
	t.Helper()
	var st engine.Stats
	if !nettest.Until(hangLimit, func() bool { st = e.Stats(); return ok(st) }) {
		t.Fatalf("stats %+v: want %s", st, what)
	}
}

// TestRelayKindsRunOnSeparateLoops checks that the epoll backend runs
// TCP⇄TCP and TCP⇄stream relays on loops of their own (the first block in
// epoll_wait, the second park in the netpoller), that both kinds give their
// goroutine back once empty, and that closing the engine reaches a loop
// blocked in epoll_wait.
func TestRelayKindsRunOnSeparateLoops(t *testing.T) {
	cases := []struct {
		name  string
		close bool // close the engine with the relays running
	}{
		{name: "relays end", close: false},
		{name: "engine closes", close: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := engine.New(engine.Config{Backend: engine.BackendEpoll, Loops: 1, Linger: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if st := e.Stats(); st.Loops != 1 || st.StreamLoops != 1 || st.Running != 0 {
				t.Fatalf("stats %+v: want one idle loop of each kind", st)
			}
			type relay struct {
				client, server *net.TCPConn
				done           chan engine.Result
			}
			start := func(stream bool) relay {
				client, a := nettest.TCPPair(t)
				cb, server := nettest.TCPPair(t)
				var b engine.Endpoint = engine.TCPEndpoint{TCPConn: cb}
				if stream {
					b = enginetest.NewStream(cb)
				}
				r := relay{client, server, make(chan engine.Result, 1)}
				e.Start(engine.TCPEndpoint{TCPConn: a}, b, nil, func(res engine.Result) { r.done <- res })
				// A byte through proves the relay runs on its loop.
				r.client.Write([]byte("x"))
				if _, err := io.ReadFull(r.server, make([]byte, 1)); err != nil {
					t.Fatal(err)
				}
				return r
			}
			tcp := start(false)
			if st := e.Stats(); st.Running != 1 || st.LoopRelays != 1 {
				t.Fatalf("stats %+v: want one running loop for the TCP⇄TCP relay", st)
			}
			strm := start(true)
			// Sharing a loop would leave one running.
			if st := e.Stats(); st.Running != 2 || st.LoopRelays != 2 {
				t.Fatalf("stats %+v: want a second loop for the TCP⇄stream relay", st)
			}
			if tc.close {
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				for _, r := range []relay{tcp, strm} {
					if res := <-r.done; !errors.Is(res.Err, engine.ErrClosed) {
						t.Fatalf("result %v, want ErrClosed", res.Err)
					}
				}
				if st := e.Stats(); st.Running != 0 || st.LoopRelays != 0 {
					t.Fatalf("stats %+v: loops still run after Close", st)
				}
				return
			}
			for _, r := range []relay{tcp, strm} {
				r.client.CloseWrite()
				r.server.CloseWrite()
				if res := <-r.done; res.Err != nil {
					t.Fatal(res.Err)
				}
			}
			waitStats(t, e, "no running loop once both relays ended", func(st engine.Stats) bool {
				return st.Running == 0 && st.LoopRelays == 0
			})
		})
	}
}
