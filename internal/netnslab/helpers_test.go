package netnslab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// hangGuard only turns a hang into a failure; no test asserts on timing.
const hangGuard = 10 * time.Second

// newLab builds nodes × pods: nodes node0.., pods pod<N>-<P>.
func newLab(t *testing.T, nodes, pods int) *Lab {
	t.Helper()
	l := New(t)
	for i := range nodes {
		n, err := l.AddNode(fmt.Sprintf("node%d", i))
		if err != nil {
			t.Fatal(err)
		}
		for j := range pods {
			if _, err := n.AddPod(fmt.Sprintf("pod%d-%d", i, j)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return l
}

func mustPod(t *testing.T, l *Lab, name string) *Pod {
	t.Helper()
	p, ok := l.Pod(name)
	if !ok {
		t.Fatalf("no pod %q in %v", name, l)
	}
	return p
}

func listen(t *testing.T, ns NS, addr string) net.Listener {
	t.Helper()
	ln, err := ns.Listen("tcp4", addr)
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, ns.NetNS, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// accepted is one connection accepted by a listener, echoed back, and described.
type accepted struct {
	local, remote netip.AddrPort
	origDst       netip.AddrPort // zero unless the listener was reached through REDIRECT
	err           error
}

// serveOne accepts one connection on ln, reads one line, answers "echo:<line>" and
// reports what it saw. The goroutine ends when the connection is done or ln is closed
// (at cleanup at the latest).
func serveOne(t *testing.T, ln net.Listener) <-chan accepted {
	t.Helper()
	ch := make(chan accepted, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			ch <- accepted{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(hangGuard))
		a := accepted{
			local:  c.LocalAddr().(*net.TCPAddr).AddrPort(),
			remote: c.RemoteAddr().(*net.TCPAddr).AddrPort(),
		}
		a.origDst, _ = originalDst(c)
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		if err == nil {
			_, err = c.Write(append([]byte("echo:"), buf[:n]...))
		}
		a.err = err
		ch <- a
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ch
}

func await(t *testing.T, ch <-chan accepted, what string) accepted {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		return a
	case <-time.After(hangGuard):
		t.Fatalf("%s: nothing accepted within %v", what, hangGuard)
		return accepted{}
	}
}

// roundTrip dials from ns with d, sends msg and checks the echo.
func roundTrip(t *testing.T, ns NS, d *net.Dialer, to netip.AddrPort, msg string) netip.AddrPort {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	c, err := ns.DialWith(ctx, d, "tcp4", to.String())
	if err != nil {
		t.Fatalf("dial %s from %s: %v", to, ns.NetNS, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(hangGuard))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if want := "echo:" + msg; string(got) != want {
		t.Fatalf("echo from %s = %q, want %q", to, got, want)
	}
	return c.LocalAddr().(*net.TCPAddr).AddrPort()
}

// originalDst reads SO_ORIGINAL_DST (IPv4): the destination before REDIRECT.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not TCP")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var gerr error
	err = rc.Control(func(fd uintptr) {
		// The kernel writes a struct sockaddr_in; IPv6Mreq is merely a 20-byte buffer.
		mreq, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			gerr = err
			return
		}
		sa := mreq.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), binary.BigEndian.Uint16(sa[2:4]))
	})
	return ap, errors.Join(err, gerr)
}

// dialer returns a Dialer setting SO_MARK (if mark != 0), IP_TRANSPARENT and a
// local address (if from is valid), as the proxy's sockets do.
func dialer(mark int, from netip.Addr) *net.Dialer {
	d := &net.Dialer{Timeout: hangGuard}
	if from.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
	}
	d.Control = func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if mark != 0 {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark)
			}
			if serr == nil && from.IsValid() {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
			}
		})
		return errors.Join(err, serr)
	}
	return d
}

func deadline() time.Time { return time.Now().Add(hangGuard) }
