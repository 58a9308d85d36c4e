package record

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// Reading in fd mode: TryRead's leftovers, hostile records, Drained, and
// an idle end holding no buffer.

// TestTryReadLeftover: the client's Finished and its first data arrive in
// one TCP segment, so the server's handshake leaves the data record in the
// read buffer; after UseFD the first TryRead must return it, though the
// socket has nothing more.
func TestTryReadLeftover(t *testing.T) {
	buffered := 0
	for i := range 30 {
		ccfg, scfg := testConfigs(t)
		cr, sr := nettest.TCPPair(t)
		hc := &holdConn{Conn: cr}
		cli, srv := Client(hc, ccfg), Server(sr, scfg)
		msg := []byte("first data")
		handshakeWithHeldData(t, cli, srv, hc, msg)
		srv.rmu.Lock()
		inBuf := srv.rb != nil && srv.w-srv.r > 0
		srv.rmu.Unlock()
		if !inBuf {
			// The data came in a later segment: not this test's case.
			cli.Close()
			srv.Close()
			continue
		}
		buffered++
		fd := detachFD(t, srv)
		got := make([]byte, 100)
		n, err := srv.TryRead(got)
		if err != nil || !bytes.Equal(got[:n], msg) {
			t.Fatalf("round %d: first TryRead %q, %v; want %q", i, got[:n], err, msg)
		}
		if _, err := srv.TryRead(got); err != ErrWouldBlock {
			t.Fatalf("round %d: second TryRead: %v, want ErrWouldBlock", i, err)
		}
		_ = fd
		cli.Close()
		srv.Close()
	}
	if buffered == 0 {
		t.Fatal("the data never came with the Finished")
	}
}

// TestHostileRecordsFD feeds every hostile stream to a server in fd mode:
// TryRead must end as Read does (same data, same error), the error must be
// sticky, a TryWrite after a protocol error must fail and queue the alert,
// and TryClose must deliver it: the peer reads the alert.
func TestHostileRecordsFD(t *testing.T) {
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			c, s := pair(t, kindOurs, kindOurs, nil)
			cli, srv := c.(*Conn), s.(*Conn)
			if tc.toClient {
				cli, srv = srv, cli
			}
			fd := detachFD(t, srv)
			if _, err := cli.raw.Write(tc.wire(t, cli)); err != nil {
				t.Fatal(err)
			}
			if tc.closeRaw {
				if err := cli.raw.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
					t.Fatal(err)
				}
			}
			got, err := fdReadAll(t, srv, fd)
			checkHostileEnd(t, tc, got, err)
			if _, err2 := srv.TryRead(make([]byte, 10)); err2 == nil || err2 == ErrWouldBlock {
				t.Fatalf("TryRead after the error: %v", err2)
			}
			if tc.wantAlert == 0 {
				return
			}
			if ok, _, err := srv.TryWrite([]byte("x")); !ok || err == nil {
				t.Fatalf("TryWrite after a protocol error = %v, %v; want true and an error", ok, err)
			}
			for !srv.TryClose() {
				waitFD(t, fd, unix.POLLOUT)
			}
			_, err = io.ReadAll(cli)
			if !errors.Is(err, AlertError(tc.wantAlert)) {
				t.Fatalf("client read %v, want the alert %s", err, tc.wantAlert)
			}
		})
	}
}

// TestDrained: with the peer idle and everything it sent in our socket
// buffer, reading until Drained first says true must have returned every
// byte, left the socket empty, and the next TryRead must find nothing; and
// Drained must be false while a record is buffered but not yet returned
// (a read into a small p).
func TestDrained(t *testing.T) {
	c, fd, peer := fdPair(t, true, kindOurs)
	p := make([]byte, 64<<10)
	for _, size := range []int{1, 100, 16384, 40000} {
		msg := make([]byte, size)
		rand.Read(msg)
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		waitQueued(t, fd, sealedSize(size))
		var got []byte
		for {
			n, err := c.TryRead(p)
			if err != nil {
				t.Fatalf("%d bytes: TryRead after %d: %v", size, len(got), err)
			}
			got = append(got, p[:n]...)
			if c.Drained() {
				break
			}
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("%d bytes sent: Drained after %d bytes read", size, len(got))
		}
		if q := queued(t, fd); q != 0 {
			t.Fatalf("%d bytes sent: Drained with %d bytes in the socket", size, q)
		}
		if _, err := c.TryRead(p); err != ErrWouldBlock {
			t.Fatalf("%d bytes sent: TryRead after Drained: %v", size, err)
		}
	}
	// Two records come in one socket read; a 1-byte p leaves the rest of
	// the first as plaintext, then the second as a complete record.
	if _, err := peer.Write([]byte("ab")); err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Write([]byte("cd")); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, fd, sealedSize(2)*2)
	var got []byte
	for len(got) < 4 {
		n, err := c.TryRead(p[:1])
		if err != nil {
			t.Fatalf("TryRead after %q: %v", got, err)
		}
		got = append(got, p[:n]...)
		if len(got) < 4 && c.Drained() {
			t.Fatalf("Drained after %q of \"abcd\"", got)
		}
	}
	// The last calls were served from the buffer: the socket may hold
	// more since, so Drained waits for a call that reads it.
	if c.Drained() {
		t.Fatal("Drained after calls that did not read the socket")
	}
	if _, err := c.TryRead(p); err != ErrWouldBlock {
		t.Fatalf("TryRead once everything was read: %v", err)
	}
	if !c.Drained() {
		t.Fatal("not Drained after a TryRead found the socket empty")
	}
}

// TestDrainedOnlyAfterSocketRead: a TryRead served from what an earlier
// socket read buffered must not leave Drained saying the socket is empty.
// The peer's next record arrives after the short read; a caller trusting a
// stale Drained would stop before reading it (its edge already consumed),
// and the connection would stall.
func TestDrainedOnlyAfterSocketRead(t *testing.T) {
	c, fd, peer := fdPair(t, true, kindOurs)
	if _, err := peer.Write(bytes.Repeat([]byte{'a'}, 100)); err != nil {
		t.Fatal(err)
	}
	waitFD(t, fd, unix.POLLIN)
	half := make([]byte, 50)
	if n, err := c.TryRead(half); n != 50 || err != nil {
		t.Fatalf("first TryRead: %d %v", n, err)
	}
	if c.Drained() {
		t.Fatal("Drained = true with 50 bytes of plaintext still to return")
	}
	if _, err := peer.Write(bytes.Repeat([]byte{'b'}, 100)); err != nil {
		t.Fatal(err)
	}
	waitFD(t, fd, unix.POLLIN)
	if n, err := c.TryRead(half); n != 50 || err != nil || half[0] != 'a' {
		t.Fatalf("second TryRead (the buffered half): %d %v %q", n, err, half[:1])
	}
	if c.Drained() {
		t.Fatal("Drained = true after a TryRead that did not read the socket: the peer's second record would be left unread")
	}
	got, err := c.TryRead(make([]byte, 200))
	if got != 100 || err != nil {
		t.Fatalf("third TryRead (the second record): %d %v", got, err)
	}
}

// TestFDIdleHoldsNoBuffer: an fd-mode connection that has read and written
// everything holds neither a read nor an output buffer.
func TestFDIdleHoldsNoBuffer(t *testing.T) {
	c, fd, peer := fdPair(t, true, kindOurs)
	for _, n := range []int{1, 16385, 1 << 20} {
		fdExchange(t, c, fd, peer, n)
		if _, err := c.TryRead(make([]byte, 10)); err != ErrWouldBlock {
			t.Fatalf("TryRead on an idle connection: %v", err)
		}
		c.rmu.Lock()
		rb := c.rb != nil
		c.rmu.Unlock()
		c.wmu.Lock()
		ob := c.backlog != nil
		c.wmu.Unlock()
		if rb || ob {
			t.Errorf("after %d bytes: idle connection holds read buffer %v, output buffer %v", n, rb, ob)
		}
	}
}
