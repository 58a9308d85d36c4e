package dnsproxy

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// udpBufs are the datagram buffers of watched UDP sockets, taken for one
// read: a quiet socket holds none.
var udpBufs = sync.Pool{New: func() any { b := make([]byte, MaxRequestSize+1); return &b }}

// rawSocket is a watched socket (Config.Watch) taken out of Go's poller:
// its own descriptor, read and accepted from without blocking when the
// watcher says it is ready. Out of the poller a quiet socket costs its
// descriptor and this, where a Go socket also holds a poll descriptor
// (~0.6 KiB, never returned to the OS) and its netFD; a pod's DNS proxy
// has four, most pods' are nearly always quiet.
type rawSocket struct {
	addr net.Addr // for logs

	mu sync.Mutex // guards fd
	fd int        // -1 once closed
}

// Control runs f on the descriptor: rawSocket is the syscall.RawConn
// Config.Watch registers. Read and Write are not used.
func (r *rawSocket) Control(f func(fd uintptr)) error {
	f(uintptr(r.fd))
	return nil
}

// Read is not supported: the watcher only registers the descriptor.
func (r *rawSocket) Read(func(fd uintptr) bool) error { return errors.ErrUnsupported }

// Write is not supported: the watcher only registers the descriptor.
func (r *rawSocket) Write(func(fd uintptr) bool) error { return errors.ErrUnsupported }

func (r *rawSocket) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fd >= 0 {
		_ = unix.Close(r.fd)
		r.fd = -1
	}
}

// detach returns a descriptor of c's socket of its own (close-on-exec,
// non-blocking as the socket is): once c is closed the socket lives on
// outside Go's poller.
func detach(c syscall.Conn, addr net.Addr) (*rawSocket, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	return &rawSocket{addr: addr, fd: nfd}, nil
}

// watch takes pc and ln out of Go's poller and puts them on Config.Watch,
// and reports whether it did; when it did not, the caller serves both
// from goroutines of their own. On success pc and ln are closed (their
// sockets live on in the detached descriptors).
func (s *Server) watch(pc net.PacketConn, ln net.Listener) bool {
	if s.cfg.Watch == nil {
		return false
	}
	uc, okU := pc.(syscall.Conn)
	tc, okT := ln.(syscall.Conn)
	if !okU || !okT {
		return false
	}
	u, err := detach(uc, pc.LocalAddr())
	if err != nil {
		s.log.Warn("DNS sockets not watched", "addr", pc.LocalAddr().String(), "error", err)
		return false
	}
	t, err := detach(tc, ln.Addr())
	if err != nil {
		u.close()
		s.log.Warn("DNS sockets not watched", "addr", pc.LocalAddr().String(), "error", err)
		return false
	}
	stopU, err := s.cfg.Watch(u, s.udpReady(u))
	if err != nil {
		u.close()
		t.close()
		s.log.Warn("DNS sockets not watched", "addr", pc.LocalAddr().String(), "error", err)
		return false
	}
	stopT, err := s.cfg.Watch(t, s.tcpReady(t))
	if err != nil {
		stopU()
		u.close()
		t.close()
		s.log.Warn("DNS sockets not watched", "addr", pc.LocalAddr().String(), "error", err)
		return false
	}
	s.mu.Lock()
	s.unwatch = append(s.unwatch, stopU, stopT)
	s.rawUDP, s.rawTCP = append(s.rawUDP, u), append(s.rawTCP, t)
	s.mu.Unlock()
	pc.Close()
	ln.Close()
	return true
}

// udpReady reads one datagram into a pooled buffer and answers it on the
// socket it came in on. The watcher runs it, so no Close is concurrent:
// the descriptor is read without its lock.
func (s *Server) udpReady(r *rawSocket) func() time.Duration {
	var backoff time.Duration // only the watcher touches it
	return func() time.Duration {
		bp := udpBufs.Get().(*[]byte)
		defer udpBufs.Put(bp)
		n, from, err := unix.Recvfrom(r.fd, *bp, unix.MSG_DONTWAIT)
		if err != nil {
			return s.watchFailed(&backoff, "DNS read failed", r.addr, err)
		}
		backoff = 0
		if n > MaxRequestSize {
			return 0
		}
		s.query((*bp)[:n], sockaddrAddr(from), func(out []byte) {
			// Forwarded answers come from goroutines that Close waits
			// for before it closes the descriptor.
			_ = unix.Sendto(r.fd, out, unix.MSG_DONTWAIT, from)
		})
		return 0
	}
}

// tcpReady accepts one connection and serves it on a goroutine.
func (s *Server) tcpReady(r *rawSocket) func() time.Duration {
	var backoff time.Duration
	return func() time.Duration {
		nfd, _, err := unix.Accept4(r.fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return s.watchFailed(&backoff, "DNS accept failed", r.addr, err)
		}
		backoff = 0
		// A DNS connection is rare and short: into Go's poller with it.
		f := os.NewFile(uintptr(nfd), "dns-tcp")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			s.log.Warn("DNS accept failed", "addr", r.addr.String(), "error", err)
			return 0
		}
		s.accepted(c)
		return 0
	}
}

// watchFailed is pause for the watcher: instead of sleeping it returns how
// long the socket is to be left alone (0 when there was nothing to take
// after all, or the peer gave up before the accept).
func (s *Server) watchFailed(backoff *time.Duration, msg string, addr net.Addr, err error) time.Duration {
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
		return 0
	}
	*backoff = min(max(*backoff*2, 5*time.Millisecond), time.Second)
	if !s.stopping() {
		s.log.Warn(msg, "addr", addr.String(), "error", err)
	}
	return *backoff
}

// sockaddrAddr is the address of a datagram's sender.
func sockaddrAddr(sa unix.Sockaddr) netip.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(a.Addr)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(a.Addr).Unmap()
	}
	return netip.Addr{}
}
