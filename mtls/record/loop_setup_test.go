package record

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// Entering fd mode: when UseFD refuses, and what the blocking methods and
// the Try methods do in the wrong mode.

// TestUseFDRefuses lists when UseFD must refuse, leaving the connection as
// it was.
func TestUseFDRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) (*Conn, int)
		// can is what CanUseFD says: it looks at the connection's state,
		// not at the descriptor or at calls in progress.
		can bool
	}{
		{"handshake not run", func(t *testing.T) (*Conn, int) {
			ccfg, _ := testConfigs(t)
			cr, _ := nettest.TCPPair(t)
			return Client(cr, ccfg), 0
		}, false},
		{"fallback to crypto/tls records", func(t *testing.T) (*Conn, int) {
			cli, _ := pair(t, kindFallback, kindTLS, nil)
			return cli.(*Conn), 0
		}, false},
		{"negative descriptor", func(t *testing.T) (*Conn, int) {
			cli, _ := pair(t, kindOurs, kindTLS, nil)
			return cli.(*Conn), -1
		}, true},
		{"closed", func(t *testing.T) (*Conn, int) {
			cli, _ := pair(t, kindOurs, kindTLS, nil)
			c := cli.(*Conn)
			c.Close()
			return c, 0
		}, false},
		{"a Read in progress", func(t *testing.T) (*Conn, int) {
			cli, _ := pair(t, kindOurs, kindTLS, nil)
			c := cli.(*Conn)
			c.rmu.Lock()
			t.Cleanup(c.rmu.Unlock)
			return c, 0
		}, true},
		{"a Write in progress", func(t *testing.T) (*Conn, int) {
			cli, _ := pair(t, kindOurs, kindTLS, nil)
			c := cli.(*Conn)
			c.wmu.Lock()
			t.Cleanup(c.wmu.Unlock)
			return c, 0
		}, true},
		{"twice", func(t *testing.T) (*Conn, int) {
			c, fd, _ := fdPair(t, true, kindTLS)
			return c, fd
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, fd := tc.setup(t)
			if got := c.CanUseFD(); got != tc.can {
				t.Errorf("CanUseFD = %v, want %v", got, tc.can)
			}
			wasFD := c.fdMode.Load()
			if err := c.UseFD(fd); err == nil {
				t.Fatal("UseFD succeeded")
			}
			if c.fdMode.Load() != wasFD {
				t.Fatal("a refused UseFD changed the mode")
			}
		})
	}
}

// TestCanUseFD: a connection of ours whose handshake is done may go to fd
// mode (TestUseFDRefuses has the cases where it may not).
func TestCanUseFD(t *testing.T) {
	cli, _ := pair(t, kindOurs, kindTLS, nil)
	c := cli.(*Conn)
	if !c.CanUseFD() {
		t.Fatal("CanUseFD = false on an open connection of ours")
	}
}

// TestFDModeBlockingCalls: after UseFD the blocking methods fail with
// ErrFDMode, and Close releases the buffers without touching the
// descriptor: the peer receives nothing, not even close_notify, until the
// descriptor's owner closes it.
func TestFDModeBlockingCalls(t *testing.T) {
	c, fd, peer := fdPair(t, true, kindOurs)
	for name, call := range map[string]func() error{
		"Read":       func() error { _, err := c.Read(make([]byte, 1)); return err },
		"Write":      func() error { _, err := c.Write([]byte("x")); return err },
		"Flush":      c.Flush,
		"KeyUpdate":  func() error { return c.KeyUpdate(false) },
		"CloseWrite": c.CloseWrite,
	} {
		if err := call(); !errors.Is(err, ErrFDMode) {
			t.Errorf("%s in fd mode: %v, want ErrFDMode", name, err)
		}
	}
	fdExchange(t, c, fd, peer, 1000)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryRead(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("TryRead after Close: %v, want net.ErrClosed", err)
	}
	if ok, _, err := c.TryWrite([]byte("x")); !ok || !errors.Is(err, net.ErrClosed) {
		t.Errorf("TryWrite after Close: %v, %v; want true, net.ErrClosed", ok, err)
	}
	if !c.TryClose() {
		t.Error("TryClose after Close has something to send")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		t.Fatalf("Close closed the descriptor: %v", err)
	}
	if err := unix.Shutdown(fd, unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(peer.(*Conn).raw)
	if err != nil || len(raw) != 0 {
		t.Fatalf("the peer's socket read %d bytes (%v) after our Close; want none", len(raw), err)
	}
}

// TestTryMethodsNeedFD: the fd-mode methods on a connection without one.
func TestTryMethodsNeedFD(t *testing.T) {
	cli, _ := pair(t, kindOurs, kindTLS, func(_, _ *tls.Config) {})
	c := cli.(*Conn)
	if _, err := c.TryRead(make([]byte, 1)); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("TryRead: %v", err)
	}
	if _, err := c.TryFlush(); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("TryFlush: %v", err)
	}
	if err := c.TryKeyUpdate(false); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("TryKeyUpdate: %v", err)
	}
	if c.Drained() {
		t.Error("Drained without fd mode")
	}
}
