package nettest_test

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestTCPPair(t *testing.T) {
	a, b := nettest.TCPPair(t)
	if a.LocalAddr().String() != b.RemoteAddr().String() {
		t.Fatalf("ends do not match: %v, %v", a.LocalAddr(), b.RemoteAddr())
	}
	if _, err := a.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	a.CloseWrite()
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "x" {
		t.Fatalf("read %q, %v", got, err)
	}
}

// TestDetachFD: the detached descriptor carries the connection on its own
// (the *net.TCPConn is closed, the socket is not) until the test ends.
func TestDetachFD(t *testing.T) {
	a, b := nettest.TCPPair(t)
	fd := nettest.DetachFD(t, a)
	if _, err := a.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write on the detached conn: %v, want net.ErrClosed", err)
	}
	if _, err := unix.Write(fd, []byte("fd")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Shutdown(fd, unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "fd" {
		t.Fatalf("read %q, %v", got, err)
	}
}

// TestUntil: a condition that comes true is seen (checked again after each
// pause), and one that never does gives false once the limit has passed.
func TestUntil(t *testing.T) {
	calls := 0
	if !nettest.Until(time.Minute, func() bool { calls++; return calls == 5 }) || calls != 5 {
		t.Fatalf("Until returned before the condition held, or checked it %d times", calls)
	}
	start := time.Now()
	if nettest.Until(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("Until reported a condition that never held")
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Fatal("Until gave up before its limit")
	}
}

// dial connects to s, closing the connection when the test ends.
func dial(t *testing.T, s *nettest.Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestEcho(t *testing.T) {
	s := nettest.StartEcho(t)
	c := dial(t, s)
	if err := nettest.RoundTrip(c, "hello"); err != nil {
		t.Fatal(err)
	}
	if err := nettest.CheckEcho(c.(*net.TCPConn), 1<<20, 7, 0); err != nil {
		t.Fatal(err)
	}
	if p := s.Peers(); len(p) != 1 || p[0].String() != c.LocalAddr().String() {
		t.Fatalf("peers %v, want [%v]", p, c.LocalAddr())
	}
}

func TestEchoResetAll(t *testing.T) {
	s := nettest.StartEcho(t)
	c := dial(t, s)
	if err := nettest.RoundTrip(c, "x"); err != nil {
		t.Fatal(err)
	}
	s.ResetAll()
	if _, err := c.Read(make([]byte, 1)); err == nil || err == io.EOF {
		t.Fatalf("read after reset: %v, want a reset", err)
	}
}

// TestEchoTLS: the echo half-closes a TLS connection too (close_notify).
func TestEchoTLS(t *testing.T) {
	srv, cli := tlstest.SelfSignedTLS(t)
	ln := nettest.Listen(t)
	s := nettest.Handle(t, tls.NewListener(ln, srv), nettest.Echo)
	c, err := tls.Dial("tcp", s.Addr.String(), cli)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := nettest.CheckEcho(c, 100<<10, 1, 1000); err != nil {
		t.Fatal(err)
	}
}

func TestExchange(t *testing.T) {
	c := dial(t, nettest.StartEcho(t))
	got, err := nettest.Exchange(c.(*net.TCPConn), []byte("all of it"))
	if err != nil || string(got) != "all of it" {
		t.Fatalf("Exchange = %q, %v", got, err)
	}
}
