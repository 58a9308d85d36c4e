package record

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	mrand "math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// TestTryWriteRefuses lists the cases where TryWrite must take nothing and
// say so, leaving the caller to write the usual way.
func TestTryWriteRefuses(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T) (*Conn, []byte)
	}{
		{"fallback to crypto/tls records", func(t *testing.T) (*Conn, []byte) {
			cli, _ := pair(t, kindFallback, kindTLS, nil)
			return cli.(*Conn), []byte("x")
		}},
		{"longer than MaxTryWrite", func(t *testing.T) (*Conn, []byte) {
			cli, _ := pair(t, kindOurs, kindTLS, nil)
			return cli.(*Conn), make([]byte, MaxTryWrite+1)
		}},
		{"handshake not run", func(t *testing.T) (*Conn, []byte) {
			ccfg, _ := testConfigs(t)
			cr, _ := nettest.TCPPair(t)
			return Client(cr, ccfg), []byte("x")
		}},
		{"no file descriptor under the connection", func(t *testing.T) (*Conn, []byte) {
			ccfg, scfg := testConfigs(t)
			a, b := net.Pipe()
			cli, srv := Client(a, ccfg), Server(b, scfg)
			handshakePair(t, cli, srv)
			t.Cleanup(func() {
				a.Close()
				b.Close()
			})
			return cli, []byte("x")
		}},
		{"another write holds the connection", func(t *testing.T) (*Conn, []byte) {
			cli, _ := pair(t, kindOurs, kindTLS, nil)
			c := cli.(*Conn)
			c.wmu.Lock()
			t.Cleanup(c.wmu.Unlock)
			return c, []byte("x")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, p := tc.setup(t)
			ok, queued, err := c.TryWrite(p)
			if ok || queued || err != nil {
				t.Fatalf("TryWrite = %v, %v, %v; want false, false, nil", ok, queued, err)
			}
		})
	}
}

// TestTryWriteInterleaved mixes TryWrite, Write and Flush against a
// crypto/tls reader that lags behind, so that TryWrite both completes and
// leaves records held; the reader must see every byte in order.
func TestTryWriteInterleaved(t *testing.T) {
	cli, srv := pair(t, kindOurs, kindTLS, nil)
	c := cli.(*Conn)
	// A small send buffer makes the socket fill quickly.
	if err := c.raw.(*net.TCPConn).SetWriteBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	const total = 8 << 20
	src := make([]byte, total)
	if _, err := rand.Read(src); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		var buf bytes.Buffer
		r := srv.(io.Reader)
		for buf.Len() < total {
			p := make([]byte, 4096)
			n, err := r.Read(p)
			buf.Write(p[:n])
			if err != nil {
				// Fail the writer too, rather than leave it blocked.
				srv.Close()
				break
			}
			if buf.Len()%(1<<20) < 4096 {
				time.Sleep(time.Millisecond) // lag, so the socket fills
			}
		}
		got <- buf.Bytes()
	}()
	rng := mrand.New(mrand.NewPCG(1, 2))
	var tried, took, held int
	for off := 0; off < total; {
		n := min(total-off, 1+rng.IntN(64<<10))
		p := src[off : off+n]
		if rng.IntN(4) == 0 {
			if _, err := c.Write(p); err != nil {
				t.Fatal(err)
			}
			off += n
			continue
		}
		tried++
		ok, queued, err := c.TryWrite(p)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			// Held records first: the caller's goroutine flushes them.
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		took++
		if queued {
			held++
		}
		off += n
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	b := <-got
	if !bytes.Equal(b, src) {
		t.Fatalf("reader got %d bytes, different from the %d written", len(b), total)
	}
	if took == 0 || held == 0 {
		t.Fatalf("TryWrite tried %d, took %d, left records held %d times: want both paths", tried, took, held)
	}
}

// TestTryWriteHeldThenClose checks that Close sends the held records before
// close_notify: the peer reads all of them, then io.EOF.
func TestTryWriteHeldThenClose(t *testing.T) {
	cli, srv := pair(t, kindOurs, kindTLS, nil)
	c := cli.(*Conn)
	if err := c.raw.(*net.TCPConn).SetWriteBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	p := bytes.Repeat([]byte("held records "), 4096)
	var sent []byte
	for i := 0; i < 1000; i++ {
		ok, queued, err := c.TryWrite(p)
		if err != nil || !ok {
			t.Fatalf("TryWrite = %v, %v, %v", ok, queued, err)
		}
		sent = append(sent, p...)
		if queued {
			break
		}
	}
	if c.unsent == nil {
		t.Fatal("the socket never filled")
	}
	done := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(srv)
		done <- b
	}()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if b := <-done; !bytes.Equal(b, sent) {
		t.Fatalf("peer read %d bytes before EOF, want %d", len(b), len(sent))
	}
}

// TestTryWriteAfterClose: a closed write side is an error, not a refusal.
func TestTryWriteAfterClose(t *testing.T) {
	cli, _ := pair(t, kindOurs, kindTLS, func(_, srv *tls.Config) {})
	c := cli.(*Conn)
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	ok, _, err := c.TryWrite([]byte("late"))
	if !ok || !errors.Is(err, errShutdown) {
		t.Fatalf("TryWrite after CloseWrite = %v, %v; want true, %v", ok, err, errShutdown)
	}
}
