package record

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// The fd-mode test kit: an end switched to fd mode as the engine switches
// it, and the waits and loops a caller of the Try methods runs.

// detachFD does to c's socket what the engine does before UseFD: it dups
// the descriptor and closes the *net.TCPConn (which takes the socket out of
// the runtime's poller), then hands the dup to c. The test owns the
// descriptor: it is closed at cleanup, after c's own cleanup has not
// touched it.
func detachFD(t testing.TB, c *Conn) int {
	t.Helper()
	tc, ok := c.raw.(*net.TCPConn)
	if !ok {
		t.Fatalf("raw is a %T, not a *net.TCPConn", c.raw)
	}
	fd := nettest.DetachFD(t, tc)
	if err := c.UseFD(fd); err != nil {
		t.Fatal(err)
	}
	return fd
}

// fdPair is pair with our end of kind ours switched to fd mode; peer is the
// other end, of kind peerKind, still blocking. client says which end is
// ours.
func fdPair(t testing.TB, client bool, peerKind kind) (ours *Conn, fd int, peer endpoint) {
	t.Helper()
	if client {
		cli, srv := pair(t, kindOurs, peerKind, nil)
		ours, peer = cli.(*Conn), srv
	} else {
		cli, srv := pair(t, peerKind, kindOurs, nil)
		ours, peer = srv.(*Conn), cli
	}
	return ours, detachFD(t, ours), peer
}

// waitFD waits in poll(2) until fd has one of events, and returns those it
// has. It stands in for the event loop's epoll.
func waitFD(t testing.TB, fd int, events int16) int16 {
	t.Helper()
	pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
	for {
		_, err := unix.Poll(pfd, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return pfd[0].Revents
	}
}

// fdReadAll reads c with TryRead until an error other than ErrWouldBlock,
// as an edge-triggered loop does: it stops when the socket is empty or
// Drained says the last read was short, and waits for readability. It
// returns the data and the error (io.EOF included).
func fdReadAll(t testing.TB, c *Conn, fd int) ([]byte, error) {
	t.Helper()
	var got []byte
	p := make([]byte, 20000)
	for {
		n, err := c.TryRead(p)
		got = append(got, p[:n]...)
		switch {
		case err == ErrWouldBlock:
			waitFD(t, fd, unix.POLLIN)
		case err != nil:
			return got, err
		case n > 0 && c.Drained():
			waitFD(t, fd, unix.POLLIN)
		}
	}
}

// fdFlush sends what c holds, waiting for writability between TryFlushes.
func fdFlush(t testing.TB, c *Conn, fd int) {
	t.Helper()
	for {
		done, err := c.TryFlush()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return
		}
		waitFD(t, fd, unix.POLLOUT)
	}
}

// fdWriteAll writes p with TryWrite as a loop would: when the held records
// refuse more, it waits for writability and flushes; at the end it flushes.
func fdWriteAll(t testing.TB, c *Conn, fd int, p []byte) {
	t.Helper()
	for len(p) > 0 {
		k := min(len(p), MaxTryWrite)
		ok, queued, err := c.TryWrite(p[:k])
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ok:
			p = p[k:]
		case queued:
			waitFD(t, fd, unix.POLLOUT)
			if _, err := c.TryFlush(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("TryWrite of %d bytes refused with nothing held", k)
		}
	}
	fdFlush(t, c, fd)
}

// fdExchange sends n random bytes each way at once between our fd-mode end
// (driven here, in one loop, by readiness) and a blocking peer (its
// goroutines), and checks what arrives.
func fdExchange(t *testing.T, c *Conn, fd int, peer endpoint, n int) {
	t.Helper()
	fdExchangeWith(t, c, func(ev int16) int16 { return waitFD(t, fd, ev) }, peer, n)
}

// fdExchangeWith is fdExchange waiting for readiness with wait (which
// returns the poll events it found, perhaps not those asked for).
func fdExchangeWith(t *testing.T, c *Conn, wait func(events int16) int16, peer endpoint, n int) {
	t.Helper()
	ours, theirs := make([]byte, n), make([]byte, n)
	rand.Read(ours)
	rand.Read(theirs)
	werr := make(chan error, 1)
	go func() {
		_, err := peer.Write(theirs)
		werr <- err
	}()
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, n)
		_, err := io.ReadFull(peer, b)
		if err != nil {
			b = nil
		}
		got <- b
	}()
	in := make([]byte, 0, n)
	out := ours
	buf := make([]byte, 64<<10)
	held := false
	for len(out) > 0 || held || len(in) < n {
		for !held && len(out) > 0 {
			k := min(len(out), MaxTryWrite)
			ok, queued, err := c.TryWrite(out[:k])
			if err != nil {
				t.Fatal(err)
			}
			if !ok && !queued {
				t.Fatal("TryWrite refused with nothing held")
			}
			if ok {
				out = out[k:]
			}
			held = queued
		}
		for len(in) < n {
			k, err := c.TryRead(buf[:min(len(buf), n-len(in))])
			in = append(in, buf[:k]...)
			if err == ErrWouldBlock {
				break
			}
			if err != nil {
				t.Fatalf("TryRead after %d bytes: %v", len(in), err)
			}
			if c.Drained() {
				break
			}
		}
		var ev int16
		if len(in) < n {
			ev |= unix.POLLIN
		}
		if held {
			ev |= unix.POLLOUT
		}
		if ev == 0 {
			continue
		}
		if wait(ev)&unix.POLLOUT != 0 && held {
			done, err := c.TryFlush()
			if err != nil {
				t.Fatal(err)
			}
			held = !done
		}
	}
	if err := <-werr; err != nil {
		t.Fatalf("peer write: %v", err)
	}
	if b := <-got; !bytes.Equal(b, ours) {
		t.Fatalf("peer read %d bytes, not the %d sent", len(b), n)
	}
	if !bytes.Equal(in, theirs) {
		t.Fatalf("read %d bytes, not the %d the peer sent", len(in), n)
	}
}

// edgeWaiter waits in an edge-triggered epoll on fd, as the engine's loops
// do: it reports only what changed since it last returned, so a caller
// that stops reading before the socket is empty (trusting Drained) waits
// for ever.
func edgeWaiter(t *testing.T, fd int) func(int16) int16 {
	t.Helper()
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(ep) })
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		t.Fatal(err)
	}
	return func(int16) int16 {
		var evs [1]unix.EpollEvent
		for {
			n, err := unix.EpollWait(ep, evs[:], -1)
			if err == unix.EINTR || err == nil && n == 0 {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			var got int16
			if evs[0].Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLERR|unix.EPOLLHUP) != 0 {
				got |= unix.POLLIN
			}
			if evs[0].Events&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) != 0 {
				got |= unix.POLLOUT
			}
			return got
		}
	}
}

// sealedSize is the wire size of one Write of n bytes (n > 0) by our peer.
func sealedSize(n int) int {
	r := (n + maxPlaintext - 1) / maxPlaintext
	return n + r*(headerLen+1+tagLen)
}

// queued returns how many bytes wait in fd's receive queue.
func queued(t testing.TB, fd int) int {
	t.Helper()
	n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitQueued waits until fd's receive queue holds n bytes (loopback TCP
// delivers a write's bytes a little after it returns).
func waitQueued(t testing.TB, fd, n int) {
	t.Helper()
	for queued(t, fd) < n {
		waitFD(t, fd, unix.POLLIN)
	}
}
