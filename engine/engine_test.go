package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// relayPair starts a relay between a client-facing and a server-facing TCP
// connection and returns the outer ends: client (talks to the relay's A) and
// server (behind the relay's B).
func relayPair(t *testing.T) (client, server *net.TCPConn, done chan Result, counters *Counters) {
	t.Helper()
	ctx := context.Background()
	front, err := Listen(ctx, "127.0.0.1:0", SocketOptions{ReusePort: true})
	if err != nil {
		t.Fatal(err)
	}
	back, err := Listen(ctx, "127.0.0.1:0", SocketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	defer back.Close()
	d := &Dialer{Options: SocketOptions{KeepAlive: DefaultKeepAlive}}
	cc, err := d.Dial(ctx, netip.Addr{}, front.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	a, err := front.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	if err := Accepted(a, SocketOptions{KeepAlive: DefaultKeepAlive}); err != nil {
		t.Fatal(err)
	}
	b, err := d.Dial(ctx, netip.MustParseAddr("127.0.0.1"), back.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := back.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	counters = new(Counters)
	done = make(chan Result, 1)
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	e.Start(TCPEndpoint{a}, TCPEndpoint{b}, counters, func(r Result) { done <- r })
	t.Cleanup(func() { cc.Close(); sc.Close() })
	return cc, sc, done, counters
}

func TestRelayLargeTransferBothWays(t *testing.T) {
	client, server, done, counters := relayPair(t)
	const size = 32 << 20
	payload := make([]byte, size)
	rand.Read(payload)
	want := sha256.Sum256(payload)

	// server echoes everything, then half-closes.
	go func() {
		io.Copy(server, server)
		server.CloseWrite()
	}()
	go func() {
		client.Write(payload)
		client.CloseWrite()
	}()
	h := sha256.New()
	n, err := io.Copy(h, client)
	if err != nil || n != size {
		t.Fatalf("read %d bytes, err %v", n, err)
	}
	if !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("checksum mismatch")
	}
	res := <-done
	if res.Err != nil {
		t.Fatalf("relay error: %v", res.Err)
	}
	if counters.AToB.Load() != size || counters.BToA.Load() != size {
		t.Fatalf("counters %d/%d, want %d", counters.AToB.Load(), counters.BToA.Load(), size)
	}
}

func TestRelayHalfClose(t *testing.T) {
	client, server, done, _ := relayPair(t)
	// Client finishes sending; the server still answers afterwards.
	client.Write([]byte("request"))
	client.CloseWrite()
	got, err := io.ReadAll(server)
	if err != nil || string(got) != "request" {
		t.Fatalf("server read %q, %v", got, err)
	}
	if _, err := server.Write([]byte("response after half-close")); err != nil {
		t.Fatal(err)
	}
	server.CloseWrite()
	got, err = io.ReadAll(client)
	if err != nil || string(got) != "response after half-close" {
		t.Fatalf("client read %q, %v", got, err)
	}
	if res := <-done; res.Err != nil {
		t.Fatalf("relay error: %v", res.Err)
	}
}

func TestRelayResetPropagates(t *testing.T) {
	client, server, done, _ := relayPair(t)
	client.Write([]byte("x"))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(server, buf); err != nil {
		t.Fatal(err)
	}
	// The server resets; the client must see a reset, not a clean EOF.
	TCPEndpoint{server}.Abort()
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.ReadAll(client)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read error = %v, want ECONNRESET", err)
	}
	if res := <-done; res.Err == nil {
		t.Fatal("relay reported a clean end after a reset")
	}
}

func TestOriginalDstFallsBackToLocal(t *testing.T) {
	ln, err := Listen(context.Background(), "127.0.0.1:0", SocketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	dst, err := OriginalDst(a)
	if err != nil {
		t.Fatal(err)
	}
	if dst != ln.Addr().(*net.TCPAddr).AddrPort() {
		t.Fatalf("OriginalDst = %v, want %v", dst, ln.Addr())
	}
}

func TestListenReusePortTwice(t *testing.T) {
	ctx := context.Background()
	a, err := Listen(ctx, "127.0.0.1:0", SocketOptions{ReusePort: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Listen(ctx, a.Addr().String(), SocketOptions{ReusePort: true})
	if err != nil {
		t.Fatalf("second SO_REUSEPORT listener on %s: %v", a.Addr(), err)
	}
	b.Close()
	if _, err := Listen(ctx, a.Addr().String(), SocketOptions{}); err == nil {
		t.Fatal("a listener without SO_REUSEPORT bound a taken port")
	}
}

// TestListenIPv4WildcardIsIPv4Only: 0.0.0.0 (IPV6_ENABLED=false) takes no
// IPv6 connection, where Go's "tcp" would have listened dual-stack; [::]
// stays dual-stack.
func TestListenIPv4WildcardIsIPv4Only(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		takes6 bool
	}{
		{"0.0.0.0:0", false},
		{"[::]:0", true},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			ln, err := Listen(context.Background(), tc.addr, SocketOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			port := ln.Addr().(*net.TCPAddr).Port
			c, err := net.Dial("tcp6", fmt.Sprintf("[::1]:%d", port))
			if c != nil {
				c.Close()
			}
			if (err == nil) != tc.takes6 {
				t.Fatalf("IPv6 dial to %s: %v, want taken %v", ln.Addr(), err, tc.takes6)
			}
		})
	}
}
