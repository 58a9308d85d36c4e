package app

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// TestNewEngine: the daemon's engine runs the ZTUNNEL_ENGINE backend (or
// logs why it fell back), and its /config_dump section reports the
// backend and the live relays.
func TestNewEngine(t *testing.T) {
	for _, asked := range []string{"auto", "std", "epoll", "uring"} {
		t.Run(asked, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			e, err := newEngine(&Config{Engine: asked}, log)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			want := asked
			if asked == "auto" {
				want = engine.BackendEpoll
			}
			fellBack := e.Backend() != want
			if fellBack && asked != "uring" {
				t.Fatalf("backend %q, want %q", e.Backend(), want)
			}
			if logged := strings.Contains(logs.String(), "relay engine fallback"); logged != fellBack {
				t.Fatalf("fallback to %q logged: %v; log:\n%s", e.Backend(), logged, logs.String())
			}
			if d := engineDump(e); d.Backend != e.Backend() || (d.Fallback != "") != fellBack || d.Relays != 0 {
				t.Fatalf("dump %+v before any relay", d)
			}

			client, a := enginePair(t)
			b, server := enginePair(t)
			done := make(chan engine.Result, 1)
			e.Start(engine.TCPEndpoint{TCPConn: a}, engine.TCPEndpoint{TCPConn: b}, nil, func(r engine.Result) { done <- r })
			client.Write([]byte("x"))
			if _, err := io.ReadFull(server, make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
			d := engineDump(e)
			inLoop := e.Backend() != engine.BackendStd
			if d.Relays != 1 || (d.LoopRelays == 1) != inLoop || (d.Running > 0) != inLoop || (d.Loops > 0) != inLoop {
				t.Fatalf("dump %+v with one relay running", d)
			}
			client.CloseWrite()
			server.CloseWrite()
			if r := <-done; r.Err != nil {
				t.Fatal(r.Err)
			}
		})
	}
}

// enginePair is nettest.TCPPair with a deadline on both ends, so that a
// relay that stops moving bytes fails the test rather than hanging it.
func enginePair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	c, s := nettest.TCPPair(t)
	for _, x := range []*net.TCPConn{c, s} {
		x.SetDeadline(time.Now().Add(20 * time.Second))
	}
	return c, s
}
