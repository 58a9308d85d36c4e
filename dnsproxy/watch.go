package dnsproxy

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// watchWait bounds a read or accept the watcher runs once a socket is
// readable: the datagram or connection is queued then and the call
// returns at once; the bound only keeps a readiness that vanished from
// stalling the node's other sockets.
const watchWait = 100 * time.Millisecond

// udpBufs are the datagram buffers of watched UDP sockets, taken for one
// read: a quiet socket holds none.
var udpBufs = sync.Pool{New: func() any { b := make([]byte, MaxRequestSize+1); return &b }}

// deadliner is what watching needs of a socket besides its RawConn: the
// deadline of its reads (or accepts). A UDP socket's writes must keep no
// deadline: forwarded answers are written long after the read.
type deadliner interface {
	syscall.Conn
	SetReadDeadline(time.Time) error
}

// listenerDeadline gives a TCP listener, whose only deadline is its
// accept's, a SetReadDeadline.
type listenerDeadline struct {
	*net.TCPListener
}

func (l listenerDeadline) SetReadDeadline(t time.Time) error { return l.SetDeadline(t) }

// watch puts pc and ln on Config.Watch and reports whether both are
// served from it; when neither could be, the caller serves both from
// goroutines of their own.
func (s *Server) watch(pc net.PacketConn, ln net.Listener) bool {
	if s.cfg.Watch == nil {
		return false
	}
	up, okU := pc.(deadliner)
	tcp, okT := ln.(*net.TCPListener)
	if !okU || !okT {
		return false
	}
	tl := listenerDeadline{tcp}
	var stops []func()
	for _, w := range []struct {
		c     deadliner
		ready func() time.Duration
	}{{up, s.udpReady(pc, up)}, {tl, s.tcpReady(ln, tl)}} {
		rc, err := w.c.SyscallConn()
		var stop func()
		if err == nil {
			stop, err = s.cfg.Watch(rc, w.ready)
		}
		if err != nil {
			for _, st := range stops {
				st()
			}
			s.log.Warn("DNS sockets not watched", "addr", pc.LocalAddr().String(), "error", err)
			return false
		}
		stops = append(stops, stop)
	}
	s.mu.Lock()
	s.unwatch = append(s.unwatch, stops...)
	s.mu.Unlock()
	return true
}

// udpReady reads one datagram into a pooled buffer and answers it.
func (s *Server) udpReady(pc net.PacketConn, d deadliner) func() time.Duration {
	var backoff time.Duration // only the watcher touches it
	return func() time.Duration {
		bp := udpBufs.Get().(*[]byte)
		defer udpBufs.Put(bp)
		_ = d.SetReadDeadline(time.Now().Add(watchWait))
		n, from, err := pc.ReadFrom(*bp)
		if err != nil {
			return s.watchFailed(&backoff, "DNS read failed", pc.LocalAddr(), err)
		}
		backoff = 0
		s.query(pc, (*bp)[:n], from)
		return 0
	}
}

// tcpReady accepts one connection and serves it on a goroutine.
func (s *Server) tcpReady(ln net.Listener, d deadliner) func() time.Duration {
	var backoff time.Duration
	return func() time.Duration {
		_ = d.SetReadDeadline(time.Now().Add(watchWait))
		c, err := ln.Accept()
		if err != nil {
			return s.watchFailed(&backoff, "DNS accept failed", ln.Addr(), err)
		}
		backoff = 0
		s.accepted(c)
		return 0
	}
}

// watchFailed is pause for the watcher: instead of sleeping it returns how
// long the socket is to be left alone (0 after a readiness that vanished).
func (s *Server) watchFailed(backoff *time.Duration, msg string, addr net.Addr, err error) time.Duration {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return 0
	}
	*backoff = min(max(*backoff*2, 5*time.Millisecond), time.Second)
	if !errors.Is(err, net.ErrClosed) && !s.stopping() {
		s.log.Warn(msg, "addr", addr.String(), "error", err)
	}
	return *backoff
}
