// The ends of a relay: a FIN from either side half-closes only its
// direction, a reset or a vanished peer reaches the other side and the
// relay reports it.

package enginetest

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
)

func testHalfClose(t *testing.T, e *engine.Engine, k kit, fromA bool) {
	p := k.open(t, e)
	first, second := p.Client, p.Server
	if !fromA {
		first, second = second, first
	}
	// first says its piece and half-closes; second reads to EOF, then
	// answers over the direction that is still open.
	first.Write([]byte("request"))
	first.CloseWrite()
	got, err := io.ReadAll(second)
	if err != nil || string(got) != "request" {
		t.Fatalf("read %q, %v before EOF", got, err)
	}
	answer := bytes.Repeat([]byte("answer after half-close "), 10000)
	go func() {
		second.Write(answer)
		second.CloseWrite()
	}()
	got, err = io.ReadAll(first)
	if err != nil || !bytes.Equal(got, answer) {
		t.Fatalf("half-closed side read %d bytes, %v; want %d", len(got), err, len(answer))
	}
	p.wantClean(t)
}

func abort(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func testReset(t *testing.T, e *engine.Engine, k kit, fromA bool) {
	p := k.open(t, e)
	resetter, other := p.Client, p.Server
	if !fromA {
		resetter, other = other, resetter
	}
	// Make sure the relay is up, then reset one end.
	pass(t, resetter, other, "x")
	abort(resetter)
	wantReset(t, other, "other side")
	p.wantFailed(t, "a reset")
}

func testPeerVanishes(t *testing.T, e *engine.Engine, k kit) {
	p := k.open(t, e)
	pass(t, p.Client, p.Server, "hello")
	// The server goes away without reading what keeps coming: its kernel
	// answers further data with RST, which must reach the client.
	p.Server.Close()
	buf := bytes.Repeat([]byte("z"), 64<<10)
	var err error
	for err == nil {
		_, err = p.Client.Write(buf)
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		// The reset arrived while writing.
	} else {
		t.Fatalf("client write error %v, want a reset", err)
	}
	p.wantFailed(t, "its peer vanished")
}

// testResetAfterSmall resets the server after a few small exchanges, with
// small writes from the client still arriving: the reset reaches the
// client and the relay reports it. A relay that writes and reads the server
// socket from two goroutines must not lose the reset when the write takes
// its error and the read then sees a plain end of stream.
func testResetAfterSmall(t *testing.T, e *engine.Engine, k kit) {
	p := k.open(t, e)
	one := make([]byte, 1)
	for i := range 5 {
		p.Client.Write([]byte{byte(i)})
		if _, err := io.ReadFull(p.Server, one); err != nil || one[0] != byte(i) {
			t.Fatalf("exchange %d: server read %v, %v", i, one, err)
		}
		p.Server.Write(one)
		if _, err := io.ReadFull(p.Client, one); err != nil || one[0] != byte(i) {
			t.Fatalf("exchange %d: client read %v, %v", i, one, err)
		}
	}
	abort(p.Server)
	var err error
	for err == nil {
		_, err = p.Client.Write([]byte("small write after the reset"))
		if err == nil {
			// Reading sees the reset as soon as it has arrived.
			p.Client.SetReadDeadline(time.Now().Add(time.Millisecond))
			_, err = p.Client.Read(one)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				err = nil
			}
		}
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("client saw %v, want a reset", err)
	}
	p.wantFailed(t, "a reset")
}
