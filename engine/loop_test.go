package engine

import (
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// loopbackPair is nettest.TCPPair with a deadline on both ends, so that a
// relay that stops moving bytes fails the test rather than hanging it.
func loopbackPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	c, s := nettest.TCPPair(t)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	s.SetDeadline(time.Now().Add(20 * time.Second))
	return c, s
}

func TestBackendChoice(t *testing.T) {
	uringErr := probeUring()
	auto := BackendEpoll
	fallbackUring := BackendUring
	if uringErr != nil {
		fallbackUring = auto
	}
	tests := []struct {
		name     string
		backend  string
		fallback bool
		want     string
		wantErr  bool
	}{
		{name: "zero config is auto", want: auto},
		{name: "auto", backend: "auto", want: auto},
		{name: "std", backend: "std", want: BackendStd},
		{name: "epoll", backend: "epoll", want: BackendEpoll},
		{name: "epoll with fallback", backend: "epoll", fallback: true, want: BackendEpoll},
		{name: "std with fallback", backend: "std", fallback: true, want: BackendStd},
		{name: "unknown", backend: "kqueue", wantErr: true},
		{name: "unknown with fallback", backend: "kqueue", fallback: true, wantErr: true},
		// A refused io_uring falls back to auto when the caller allows it
		// (the daemon does, for ZTUNNEL_ENGINE); otherwise it is an error.
		{name: "uring with fallback", backend: "uring", fallback: true, want: fallbackUring},
		{name: "uring", backend: "uring", want: BackendUring, wantErr: uringErr != nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(Config{Backend: tc.backend, Fallback: tc.fallback})
			if tc.wantErr {
				if err == nil {
					e.Close()
					t.Fatalf("New succeeded with backend %q", e.Backend())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if got := e.Backend(); got != tc.want {
				t.Fatalf("Backend() = %q, want %q", got, tc.want)
			}
			if got := e.Stats().Backend; got != tc.want {
				t.Fatalf("Stats().Backend = %q, want %q", got, tc.want)
			}
			// Fallback says why exactly when another backend than the one
			// asked for runs.
			asked := tc.backend
			if asked == "" || asked == BackendAuto {
				asked = auto
			}
			if fell := e.Fallback() != nil; fell != (tc.want != asked) {
				t.Fatalf("Fallback() = %v with backend %q asked, %q running", e.Fallback(), asked, tc.want)
			}
		})
	}
}

func TestIdleTimeoutResetsBothSides(t *testing.T) {
	for _, name := range []string{BackendEpoll, BackendUring} {
		t.Run(name, func(t *testing.T) {
			const idle = 300 * time.Millisecond
			e, err := New(Config{Backend: name, IdleTimeout: idle})
			if err != nil {
				if name == BackendUring {
					t.Skipf("io_uring backend unavailable here: %v", err)
				}
				t.Fatal(err)
			}
			defer e.Close()
			// Two relays: one kept busy, one idle from the start.
			busyC, busyA := loopbackPair(t)
			busyB, busyS := loopbackPair(t)
			client, a := loopbackPair(t)
			b, server := loopbackPair(t)
			busyDone := make(chan Result, 1)
			e.Start(TCPEndpoint{busyA}, TCPEndpoint{busyB}, nil, func(r Result) { busyDone <- r })
			done := make(chan Result, 1)
			start := time.Now()
			e.Start(TCPEndpoint{a}, TCPEndpoint{b}, nil, func(r Result) { done <- r })
			// Nothing moves on the second: it ends on its own, while the
			// first, a byte each way every few milliseconds, stays up.
			one := make([]byte, 1)
			var res Result
			for ended := false; !ended; {
				select {
				case res = <-done:
					ended = true
				case <-time.After(5 * time.Millisecond): // traffic pacing, not synchronisation
					if time.Since(start) > 20*time.Second {
						t.Fatal("the idle relay did not time out")
					}
					busyC.Write(one)
					if _, err := io.ReadFull(busyS, one); err != nil {
						t.Fatalf("busy relay: %v", err)
					}
				}
			}
			if !errors.Is(res.Err, ErrIdleTimeout) {
				t.Fatalf("result %v, want ErrIdleTimeout", res.Err)
			}
			if d := time.Since(start); d < idle {
				t.Fatalf("idle relay ended after %v, before its timeout of %v", d, idle)
			}
			for _, c := range []*net.TCPConn{client, server} {
				if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("read %v, want ECONNRESET", err)
				}
			}
			select {
			case r := <-busyDone:
				t.Fatalf("the busy relay ended: %v", r.Err)
			default:
			}
			busyC.CloseWrite()
			busyS.CloseWrite()
			if r := <-busyDone; r.Err != nil {
				t.Fatalf("busy relay ended with %v", r.Err)
			}
		})
	}
}

func TestLoopsParkWhenEmptyAndRestart(t *testing.T) {
	e, err := New(Config{Backend: BackendEpoll, Loops: 1, Linger: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for round := range 3 {
		client, a := loopbackPair(t)
		b, server := loopbackPair(t)
		res := make(chan Result, 1)
		e.Start(TCPEndpoint{a}, TCPEndpoint{b}, nil, func(r Result) { res <- r })
		client.Write([]byte("hi"))
		client.CloseWrite()
		server.CloseWrite()
		if got, err := io.ReadAll(server); err != nil || string(got) != "hi" {
			t.Fatalf("round %d: server read %q, %v", round, got, err)
		}
		if r := <-res; r.Err != nil {
			t.Fatal(r.Err)
		}
		// With no relay left the loop gives its thread back.
		if !nettest.Until(10*time.Second, func() bool { return e.Stats().Running == 0 }) {
			t.Fatalf("round %d: loop still running with no relay", round)
		}
	}
}

// TestEmptyLoopLingersParked checks how a blocking TCP⇄TCP loop waits:
// in epoll_wait (the goroutine "[syscall]") while it holds a relay, and
// parked in the netpoller ("[IO wait]", holding no P) while it lingers with
// none. Lingering blocked, the loops held the daemon's Ps until the
// runtime's monitor took them back, up to 10-20 ms during which no other
// goroutine ran (the Node scenario's add-to-ack tail).
func TestEmptyLoopLingersParked(t *testing.T) {
	e, err := New(Config{Backend: BackendEpoll, Loops: 1, Linger: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	loopState := func() string {
		buf := make([]byte, 1<<20)
		for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "engine.(*eloop).run(") {
				head, _, _ := strings.Cut(g, "\n")
				return head
			}
		}
		return ""
	}
	waitsIn := func(state string) bool {
		return nettest.Until(10*time.Second, func() bool { return strings.Contains(loopState(), state) })
	}
	client, a := loopbackPair(t)
	b, server := loopbackPair(t)
	res := make(chan Result, 1)
	e.Start(TCPEndpoint{a}, TCPEndpoint{b}, nil, func(r Result) { res <- r })
	client.Write([]byte("hi"))
	if _, err := io.ReadFull(server, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	if !waitsIn("[syscall") {
		t.Fatalf("a loop holding a relay waits as %q, want blocked in epoll_wait", loopState())
	}
	client.CloseWrite()
	server.CloseWrite()
	if r := <-res; r.Err != nil {
		t.Fatal(r.Err)
	}
	if !waitsIn("[IO wait") {
		t.Fatalf("a lingering loop waits as %q, want parked in the netpoller", loopState())
	}
	if st := e.Stats(); st.Running != 1 {
		t.Fatalf("%d loops running, want the lingering one", st.Running)
	}
}

// wrapped hides the TCPEndpoint type, as a non-TCP endpoint would.
type wrapped struct{ TCPEndpoint }

func TestNonTCPEndpointsRelayWithGoroutines(t *testing.T) {
	e, err := New(Config{Backend: BackendEpoll})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	client, a := loopbackPair(t)
	b, server := loopbackPair(t)
	var c Counters
	res := make(chan Result, 1)
	e.Start(wrapped{TCPEndpoint{a}}, TCPEndpoint{b}, &c, func(r Result) { res <- r })
	client.Write([]byte("through goroutines"))
	client.CloseWrite()
	if got, _ := io.ReadAll(server); string(got) != "through goroutines" {
		t.Fatalf("server read %q", got)
	}
	if st := e.Stats(); st.LoopRelays != 0 || st.Relays != 1 {
		t.Fatalf("stats %+v: want the relay outside the loops", st)
	}
	server.CloseWrite()
	if r := <-res; r.Err != nil || c.AToB.Load() != 18 {
		t.Fatalf("result %v, A→B %d", r.Err, c.AToB.Load())
	}
}

func TestManyLoopsShareRelays(t *testing.T) {
	e, err := New(Config{Backend: BackendEpoll, Loops: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	const n = 16
	type pair struct{ client, server *net.TCPConn }
	var pairs []pair
	done := make(chan Result, n)
	for range n {
		client, a := loopbackPair(t)
		b, server := loopbackPair(t)
		e.Start(TCPEndpoint{a}, TCPEndpoint{b}, nil, func(r Result) { done <- r })
		pairs = append(pairs, pair{client, server})
	}
	for _, p := range pairs {
		p.client.Write([]byte("x"))
		io.ReadFull(p.server, make([]byte, 1))
	}
	if st := e.Stats(); st.Loops != 4 || st.StreamLoops != 4 || st.Running != 4 || st.LoopRelays != n {
		t.Fatalf("stats %+v: want %d relays spread over 4 running loops", st, n)
	}
	for _, p := range pairs {
		p.client.CloseWrite()
		p.server.CloseWrite()
	}
	for range n {
		if r := <-done; r.Err != nil {
			t.Fatal(r.Err)
		}
	}
}

// TestRelayStepsDoNotAllocate checks the hot path: once a relay runs,
// moving bytes allocates nothing (pipes come from the pool, events and
// completions land in preallocated arrays).
func TestRelayStepsDoNotAllocate(t *testing.T) {
	for _, name := range []string{BackendEpoll, BackendUring} {
		t.Run(name, func(t *testing.T) {
			e, err := New(Config{Backend: name})
			if err != nil {
				t.Skipf("%s unavailable: %v", name, err)
			}
			defer e.Close()
			client, a := loopbackPair(t)
			b, server := loopbackPair(t)
			done := make(chan Result, 1)
			e.Start(TCPEndpoint{a}, TCPEndpoint{b}, nil, func(r Result) { done <- r })
			one := make([]byte, 1)
			roundTrip := func() {
				client.Write(one)
				io.ReadFull(server, one)
				server.Write(one)
				io.ReadFull(client, one)
			}
			for range 10 {
				roundTrip() // warm the pipe pool and the loop's arrays
			}
			if avg := testing.AllocsPerRun(200, roundTrip); avg > 0.1 {
				t.Fatalf("%.2f allocations per round trip through the relay", avg)
			}
			client.CloseWrite()
			server.CloseWrite()
			if r := <-done; r.Err != nil {
				t.Fatal(r.Err)
			}
		})
	}
}
