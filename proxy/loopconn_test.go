package proxy

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// loopOwnedEcho starts an inbound proxy whose HBONE connections an epoll
// engine's loops own (the daemon's defaults: loop-owned connections,
// blocking stream loops) and opens one HBONE connection with a stream to an
// echo app through it.
func loopOwnedEcho(t *testing.T) (*engine.Engine, *inboundRig, *hbone.ClientConn, *hbone.Stream) {
	t.Helper()
	eng, err := engine.New(engine.Config{Backend: engine.BackendEpoll, BlockStreamLoops: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	loopEngines.Store(eng, struct{}{})
	t.Cleanup(func() { loopEngines.Delete(eng) })
	app := echoApp(t)
	rig := startInbound(t, 1, withEngine(eng))
	cc, s, _, err := connectHBONEConn(t, rig.ca, rig.hbonePort, "client", "srv", &hbone.Request{Authority: fmt.Sprintf("127.0.0.1:%d", app)})
	if err != nil {
		t.Fatal(err)
	}
	return eng, rig, cc, s
}

// TestLoopOwnedHBONE: with LoopDrive, the inbound server's HBONE
// connection is owned by an engine loop (Stats.Conns counts it while it is
// open), its stream's relay is readied on that loop without a task
// (Stats.LocalWakes), 4 MiB echo both ways arrive whole, and once the
// client closes its connection the engine holds none.
func TestLoopOwnedHBONE(t *testing.T) {
	eng, _, cc, s := loopOwnedEcho(t)
	if n := eng.Stats().Conns; n != 1 {
		t.Errorf("the engine owns %d connections with one HBONE connection open, want 1", n)
	}
	payload := make([]byte, 4<<20)
	rand.Read(payload)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(s)
		got <- b
	}()
	if _, err := s.Write(payload); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	select {
	case b := <-got:
		if !bytes.Equal(b, payload) {
			t.Fatalf("echo of %d bytes came back as %d different bytes", len(payload), len(b))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no echo within 30 s")
	}
	if st := eng.Stats(); st.LocalWakes == 0 {
		t.Errorf("no relay readied on its connection's loop after a 4 MiB echo: %+v", st)
	}
	s.Close()
	cc.Close()
	if !nettest.Until(10*time.Second, func() bool { return eng.Stats().Conns == 0 }) {
		t.Fatalf("the engine still owns %d connections 10 s after the client closed", eng.Stats().Conns)
	}
}

// TestLoopOwnedHBONEHoldsNoWorker: an inbound HBONE connection a loop owns
// holds no proxy worker while it is open (no goroutine is left in
// handleHBONE once the handshake is done and the loop has it), and its
// end gives back what the worker's return used to: the peer's count
// (peerDone), the proxy's hold on the socket (release).
func TestLoopOwnedHBONEHoldsNoWorker(t *testing.T) {
	_, rig, cc, s := loopOwnedEcho(t)
	echoOnce := func() {
		if _, err := s.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("echo %q, %v", buf, err)
		}
	}
	echoOnce()
	inHandler := func() bool {
		buf := make([]byte, 1<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "proxy.(*Proxy).handleHBONE")
	}
	if !nettest.Until(10*time.Second, func() bool { return !inHandler() }) {
		t.Fatal("a worker is still in handleHBONE while the loop-owned connection is open")
	}
	echoOnce() // still served
	held := func() (peers, conns int) {
		rig.p.mu.Lock()
		defer rig.p.mu.Unlock()
		return len(rig.p.peers), len(rig.p.conns)
	}
	if peers, conns := held(); peers != 1 || conns != 1 {
		t.Fatalf("with the connection open the proxy counts %d peers and %d connections, want 1 and 1", peers, conns)
	}
	s.Close()
	cc.Close()
	if !nettest.Until(10*time.Second, func() bool { p, c := held(); return p == 0 && c == 0 }) {
		peers, conns := held()
		t.Fatalf("10 s after the client closed the proxy counts %d peers and %d connections, want none", peers, conns)
	}
}
