package record

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

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
	rc, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		t.Fatal(err)
	}
	if derr != nil {
		t.Fatal(derr)
	}
	if err := tc.Close(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
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
		errc := make(chan error, 1)
		go func() {
			if err := cli.HandshakeContext(t.Context()); err != nil {
				errc <- err
				return
			}
			if _, err := cli.Write(msg); err != nil {
				errc <- err
				return
			}
			errc <- hc.flush()
		}()
		if err := srv.HandshakeContext(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
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

// TestTryCloseOwedAlert: TryClose alone (no TryWrite first) sends the
// fatal alert a failed TryRead owes, and only once.
func TestTryCloseOwedAlert(t *testing.T) {
	srv, fd, peer := fdPair(t, false, kindOurs)
	cli := peer.(*Conn)
	b := sealed(t, cli, typeApplicationData, []byte("tampered"))
	b[7] ^= 1
	if _, err := cli.raw.Write(b); err != nil {
		t.Fatal(err)
	}
	_, err := fdReadAll(t, srv, fd)
	var pe *ProtocolError
	if !errors.As(err, &pe) || alert(pe.Alert) != alertBadRecordMAC {
		t.Fatalf("TryRead: %v, want bad_record_mac", err)
	}
	for !srv.TryClose() {
		waitFD(t, fd, unix.POLLOUT)
	}
	if !srv.TryClose() {
		t.Fatal("a second TryClose has something to send")
	}
	if _, err := io.ReadAll(cli); !errors.Is(err, AlertError(alertBadRecordMAC)) {
		t.Fatalf("peer read %v, want bad_record_mac", err)
	}
}

// TestTryCloseOwedAlertTLSPeer: a crypto/tls peer receives the fatal
// alert TryClose sends after a failed TryRead (here unexpected_message, for
// a record of an unknown type the peer's socket carries).
func TestTryCloseOwedAlertTLSPeer(t *testing.T) {
	for _, client := range []bool{true, false} {
		t.Run(map[bool]string{true: "our-client", false: "our-server"}[client], func(t *testing.T) {
			c, fd, peer := fdPair(t, client, kindTLS)
			// The peer's raw socket: the tls.Conn's NetConn.
			raw := peer.(*tls.Conn).NetConn()
			if _, err := raw.Write([]byte{24, 3, 3, 0, 1, 0}); err != nil {
				t.Fatal(err)
			}
			_, err := fdReadAll(t, c, fd)
			var pe *ProtocolError
			if !errors.As(err, &pe) || alert(pe.Alert) != alertUnexpectedMessage {
				t.Fatalf("TryRead: %v, want unexpected_message", err)
			}
			for !c.TryClose() {
				waitFD(t, fd, unix.POLLOUT)
			}
			_, err = io.ReadAll(peer)
			if err == nil || !strings.Contains(err.Error(), "unexpected message") {
				t.Fatalf("crypto/tls peer read %v, want the unexpected_message alert", err)
			}
		})
	}
}

// TestTryCloseNotify: after data, TryClose's close_notify reaches a
// crypto/tls peer, as either end. A bogus record written on the socket
// behind it proves it: a peer that had not read close_notify would fail on
// that record instead of ending cleanly.
func TestTryCloseNotify(t *testing.T) {
	for _, client := range []bool{true, false} {
		t.Run(map[bool]string{true: "our-client", false: "our-server"}[client], func(t *testing.T) {
			c, fd, peer := fdPair(t, client, kindTLS)
			msg := bytes.Repeat([]byte("before close "), 5000)
			got := make(chan []byte, 1)
			errc := make(chan error, 1)
			go func() {
				b, err := io.ReadAll(peer)
				got <- b
				errc <- err
			}()
			fdWriteAll(t, c, fd, msg)
			for !c.TryClose() {
				waitFD(t, fd, unix.POLLOUT)
			}
			if _, err := unix.Write(fd, []byte{typeApplicationData, 3, 3, 0, 1, 0}); err != nil {
				t.Fatal(err)
			}
			if err := unix.Shutdown(fd, unix.SHUT_WR); err != nil {
				t.Fatal(err)
			}
			if b, err := <-got, <-errc; err != nil || !bytes.Equal(b, msg) {
				t.Fatalf("peer read %d bytes, %v; want %d and close_notify", len(b), err, len(msg))
			}
			if ok, _, err := c.TryWrite([]byte("late")); !ok || !errors.Is(err, errShutdown) {
				t.Fatalf("TryWrite after TryClose = %v, %v; want true, %v", ok, err, errShutdown)
			}
		})
	}
}

// TestFDExchange runs data both ways between an fd-mode end and a blocking
// one, for each peer kind and role, at sizes around the record size.
func TestFDExchange(t *testing.T) {
	for _, peerKind := range []kind{kindTLS, kindOurs} {
		for _, client := range []bool{true, false} {
			name := string(peerKind) + "-peer/our-" + map[bool]string{true: "client", false: "server"}[client]
			t.Run(name, func(t *testing.T) {
				c, fd, peer := fdPair(t, client, peerKind)
				for _, n := range interopSizes {
					fdExchange(t, c, fd, peer, n)
				}
			})
		}
	}
}

// TestFDKeyUpdate: KeyUpdate both ways in fd mode. Ours (TryKeyUpdate,
// asking the peer to follow or not) moves our write keys, and the peer's
// answer our read keys; the peer's own KeyUpdate, read by TryRead, moves
// our read keys, and when it asks, our next TryWrite answers it.
func TestFDKeyUpdate(t *testing.T) {
	for _, tc := range []struct {
		name        string
		peerKind    kind
		ours        bool // we initiate; else the peer (ours, blocking) does
		requestPeer bool
	}{
		{"ours requesting, tls peer", kindTLS, true, true},
		{"ours not requesting, tls peer", kindTLS, true, false},
		{"ours requesting, our peer", kindOurs, true, true},
		{"peer's requesting", kindOurs, false, true},
		{"peer's not requesting", kindOurs, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, fd, peer := fdPair(t, true, tc.peerKind)
			fdExchange(t, c, fd, peer, 30000)
			in0, out0 := secrets(c)
			for range 3 {
				if tc.ours {
					if err := c.TryKeyUpdate(tc.requestPeer); err != nil {
						t.Fatal(err)
					}
				} else if err := peer.(*Conn).KeyUpdate(tc.requestPeer); err != nil {
					t.Fatal(err)
				}
				fdExchange(t, c, fd, peer, 30000)
			}
			in1, out1 := secrets(c)
			wantIn, wantOut := tc.requestPeer || !tc.ours, tc.ours || tc.requestPeer
			if got := !bytes.Equal(in0, in1); got != wantIn {
				t.Errorf("read secret changed = %v, want %v", got, wantIn)
			}
			if got := !bytes.Equal(out0, out1); got != wantOut {
				t.Errorf("write secret changed = %v, want %v", got, wantOut)
			}
		})
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

// TestFDEdgeTriggered runs the exchanges under an edge-triggered epoll, the
// engine's way: reading stops at ErrWouldBlock or when Drained says so, and
// writing waits for EPOLLOUT only when records are held. A wrong Drained
// (true with bytes left) or a held write that never met EAGAIN would leave
// the loop waiting for an edge that never comes.
func TestFDEdgeTriggered(t *testing.T) {
	for _, peerKind := range []kind{kindTLS, kindOurs} {
		t.Run(string(peerKind)+"-peer", func(t *testing.T) {
			c, fd, peer := fdPair(t, true, peerKind)
			wait := edgeWaiter(t, fd)
			for _, n := range append(interopSizes, 8<<20) {
				fdExchangeWith(t, c, wait, peer, n)
			}
		})
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

// TestTryWriteFDHeld: in fd mode, with a peer that does not read yet,
// TryWrite first takes everything (the socket, then held records), queues
// small writes behind the held ones, refuses (ok=false, queued=true, nothing
// sealed) a write that would overflow the held buffer, and never holds more
// than one output buffer; once the peer reads, TryFlush sends the rest and
// the peer receives every byte in order.
func TestTryWriteFDHeld(t *testing.T) {
	c, fd, peer := fdPair(t, true, kindTLS)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10); err != nil {
		t.Fatal(err)
	}
	var sent []byte
	chunk := make([]byte, 1000)
	var behind, refused int
	for refused == 0 {
		rand.Read(chunk)
		c.wmu.Lock()
		seq, wasHeld := c.out.seq, c.unsent != nil
		c.wmu.Unlock()
		ok, queued, err := c.TryWrite(chunk)
		if err != nil {
			t.Fatal(err)
		}
		c.wmu.Lock()
		seq2, held, capHeld := c.out.seq, len(c.unsent), 0
		if c.backlog != nil {
			capHeld = cap(*c.backlog)
		}
		c.wmu.Unlock()
		if capHeld > outBufSize {
			t.Fatalf("held buffer grew to %d bytes", capHeld)
		}
		switch {
		case ok:
			sent = append(sent, chunk...)
			if wasHeld && queued {
				behind++
			}
		case queued:
			refused++
			if seq2 != seq {
				t.Fatalf("a refused TryWrite sealed %d records", seq2-seq)
			}
			if held+sealRoom(len(chunk)) <= outBufSize {
				t.Fatalf("refused with %d bytes held, room for more", held)
			}
		default:
			t.Fatal("TryWrite refused with nothing held")
		}
	}
	if behind == 0 {
		t.Fatal("no TryWrite queued behind held records")
	}
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(sent))
		_, err := io.ReadFull(peer, b)
		if err != nil {
			b = nil
		}
		got <- b
	}()
	fdFlush(t, c, fd)
	if b := <-got; !bytes.Equal(b, sent) {
		t.Fatalf("peer read %d bytes, not the %d sent", len(b), len(sent))
	}
}

// TestTryWriteFDInterleaved is TestTryWriteInterleaved in fd mode: random
// TryWrite sizes against a crypto/tls reader that lags, waiting for
// writability only when refused; every byte arrives in order, and both the
// held and the refused paths ran.
func TestTryWriteFDInterleaved(t *testing.T) {
	c, fd, peer := fdPair(t, true, kindTLS)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10); err != nil {
		t.Fatal(err)
	}
	const total = 8 << 20
	src := make([]byte, total)
	rand.Read(src)
	got := make(chan []byte, 1)
	go func() {
		var buf bytes.Buffer
		p := make([]byte, 4096)
		for buf.Len() < total {
			n, err := peer.Read(p)
			buf.Write(p[:n])
			if err != nil {
				break
			}
			if buf.Len()%(1<<20) < 4096 {
				time.Sleep(time.Millisecond) // lag, so the socket fills
			}
		}
		got <- buf.Bytes()
	}()
	rng := newRand(1)
	var held, refused int
	for off := 0; off < total; {
		n := min(total-off, 1+rng.IntN(64<<10))
		ok, queued, err := c.TryWrite(src[off : off+n])
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ok:
			off += n
			if queued {
				held++
			}
		case queued:
			refused++
			waitFD(t, fd, unix.POLLOUT)
			if _, err := c.TryFlush(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("TryWrite refused with nothing held")
		}
	}
	fdFlush(t, c, fd)
	if b := <-got; !bytes.Equal(b, src) {
		t.Fatalf("reader got %d bytes, different from the %d written", len(b), total)
	}
	if held == 0 || refused == 0 {
		t.Fatalf("held %d times, refused %d: want both paths", held, refused)
	}
}

// TestTryWriteFDHeldThenTryClose: close_notify goes behind held records;
// the peer reads all of them, then io.EOF.
func TestTryWriteFDHeldThenTryClose(t *testing.T) {
	c, fd, peer := fdPair(t, true, kindTLS)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10); err != nil {
		t.Fatal(err)
	}
	p := bytes.Repeat([]byte("held records "), 4096)
	var sent []byte
	for {
		ok, queued, err := c.TryWrite(p)
		if err != nil || !ok {
			t.Fatalf("TryWrite = %v, %v, %v", ok, queued, err)
		}
		sent = append(sent, p...)
		if queued {
			break
		}
	}
	if c.TryClose() {
		t.Fatal("TryClose sent everything to a socket that was full")
	}
	done := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(peer)
		done <- b
	}()
	fdFlush(t, c, fd)
	if b := <-done; !bytes.Equal(b, sent) {
		t.Fatalf("peer read %d bytes before EOF, want %d", len(b), len(sent))
	}
}

// TestTryWriteSealsAll: a TryWrite of MaxTryWrite bytes that also carries
// the KeyUpdate the peer asked for and a rekey (which take the room of the
// batch's last record) still seals all of p, blocking or in fd mode.
func TestTryWriteSealsAll(t *testing.T) {
	for _, fdMode := range []bool{false, true} {
		t.Run(map[bool]string{false: "blocking", true: "fd"}[fdMode], func(t *testing.T) {
			cli, srv := pair(t, kindOurs, kindTLS, nil)
			c := cli.(*Conn)
			fd := -1
			if fdMode {
				fd = detachFD(t, c)
			}
			p := make([]byte, MaxTryWrite)
			rand.Read(p)
			got := make(chan []byte, 1)
			go func() {
				b, err := io.ReadAll(srv)
				if err != nil {
					b = nil // a lost record fails the next one's authentication
				}
				got <- b
			}()
			// After the peer's KeyUpdate the sequence restarts at 0: one
			// rekey is due before the batch's ninth record.
			old := rekeyAfter
			rekeyAfter = 8
			t.Cleanup(func() { rekeyAfter = old })
			c.pendingKeyUpdate.Store(true)
			ok, queued, err := c.TryWrite(p)
			if !ok || err != nil {
				t.Fatalf("TryWrite = %v, %v, %v", ok, queued, err)
			}
			// Then close_notify, so that the peer's read ends.
			if fdMode {
				for !c.TryClose() {
					waitFD(t, fd, unix.POLLOUT)
				}
			} else if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if b := <-got; !bytes.Equal(b, p) {
				t.Fatalf("peer read %d bytes, not the %d TryWrite took", len(b), len(p))
			}
		})
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
