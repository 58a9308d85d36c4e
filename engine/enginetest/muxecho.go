package enginetest

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// MuxEcho is one relay between a TCP client and a stream of a Mux of its
// own, whose MuxPeer bridges the stream to an echo server: the rig of the
// engine's loop-owned connection tests and benchmarks.
type MuxEcho struct {
	// Client is the application's end of the relay.
	Client *net.TCPConn
	// Mux is the stream's connection, Peer its far end.
	Mux  *Mux
	Peer *MuxPeer
	done chan engine.Result
}

// NewMuxEcho starts a MuxEcho on e. The Mux is loop-owned where e allows
// it (unless opt.Goroutines).
func NewMuxEcho(t testing.TB, e *engine.Engine, opt MuxOptions) *MuxEcho {
	t.Helper()
	cb, server := nettest.TCPPair(t)
	go echo(server)
	return newMuxEcho(t, e, opt, cb)
}

// NewMuxFrameEcho is NewMuxEcho with the echo in the MuxPeer's reader
// itself (no bridge, no goroutine per stream), so a round trip's cost is
// mostly the engine side's: keep less than MuxWindow bytes in flight.
func NewMuxFrameEcho(t testing.TB, e *engine.Engine, opt MuxOptions) *MuxEcho {
	t.Helper()
	return newMuxEcho(t, e, opt, nil)
}

func newMuxEcho(t testing.TB, e *engine.Engine, opt MuxOptions, cb *net.TCPConn) *MuxEcho {
	t.Helper()
	client, a := nettest.TCPPair(t)
	mc, rc := nettest.TCPPair(t)
	m, err := NewMux(e, mc, opt)
	if err != nil && (opt.Goroutines || e.Backend() == engine.BackendEpoll) && !(opt.Goroutines && m != nil && m.Handle() == nil) {
		t.Fatalf("NewMux: %v", err)
	}
	x := &MuxEcho{Client: client, Mux: m, done: make(chan engine.Result, 1)}
	x.Peer = NewMuxPeer(rc, func(uint32) *net.TCPConn { return cb })
	e.Start(engine.TCPEndpoint{TCPConn: a}, m.Open(), nil, func(r engine.Result) { x.done <- r })
	_ = client.SetDeadline(time.Now().Add(hang))
	return x
}

// RoundTrip sends p and reads its echo.
func (x *MuxEcho) RoundTrip(t testing.TB, p []byte) {
	t.Helper()
	if _, err := x.Client.Write(p); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(p))
	if _, err := io.ReadFull(x.Client, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, p) {
		t.Fatalf("echo of %d bytes differs", len(p))
	}
}

// End half-closes the client, reads the echo's end and waits for a clean
// result of the relay.
func (x *MuxEcho) End(t testing.TB) {
	t.Helper()
	_ = x.Client.CloseWrite()
	if rest, err := io.ReadAll(x.Client); err != nil || len(rest) > 0 {
		t.Fatalf("client read %d bytes, %v after its FIN; want EOF", len(rest), err)
	}
	if r := x.result(t); r.Err != nil {
		t.Fatalf("relay ended with %v", r.Err)
	}
}

func (x *MuxEcho) result(t testing.TB) engine.Result {
	t.Helper()
	select {
	case r := <-x.done:
		return r
	case <-time.After(hang):
		t.Fatal("relay did not end")
		return engine.Result{}
	}
}

// WaitEnded waits for the relay's result (whatever it is) and for the
// Mux and its peer to see the connection's end.
func (x *MuxEcho) WaitEnded(t testing.TB) {
	t.Helper()
	x.result(t)
	for _, ch := range []<-chan struct{}{x.Mux.Done(), x.Peer.Done()} {
		select {
		case <-ch:
		case <-time.After(hang):
			t.Fatal("the Mux connection did not end")
		}
	}
}
