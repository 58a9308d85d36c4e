package engine

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ConnectError is the result of a relay started by StartDial whose connect
// to the destination failed; the A side was reset. Err is what the dial
// reported, a *net.OpError shaped like net.Dialer's ("dial tcp ADDR:
// connect: connection refused", "dial tcp ADDR: i/o timeout").
type ConnectError struct {
	Dst netip.AddrPort // the address the connect was for
	Err error
}

func (e *ConnectError) Error() string { return e.Err.Error() }

// Unwrap returns the dial error, so errors.Is sees the errno.
func (e *ConnectError) Unwrap() error { return e.Err }

// dialError builds the error net.Dialer would have returned for a connect
// to dst that failed with err.
func dialError(dst netip.AddrPort, err error) *ConnectError {
	if errno, ok := err.(unix.Errno); ok {
		err = os.NewSyscallError("connect", errno)
	}
	return &ConnectError{Dst: dst, Err: &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(dst), Err: err}}
}

// dialBackend is a backend that completes connects in its loops (epoll).
type dialBackend interface {
	// relayDial takes ownership of a connected socket fa and of fb, whose
	// connect to dst is in flight, and relays between them once fb is
	// connected; a connect that fails, or that is not done within
	// timeout, ends s with a *ConnectError.
	relayDial(fa, fb int, dst netip.AddrPort, timeout time.Duration, s *session)
}

// StartDial connects to dst with d (from src, when valid) and relays
// between a and the new connection, like Start with a TCPEndpoint on each
// side. On the epoll backend no goroutine waits for the connect: the
// socket is created and its connect started here, and the event loop
// completes it, so the connection never passes through the runtime's
// poller (seven system calls fewer than a dial and a handoff). Other
// backends dial on the calling goroutine first.
//
// A connect that fails ends the relay with a *ConnectError after a has
// been reset; done, counters and the Handle behave as with Start. ctx
// bounds the dial on the backends that dial first.
func (e *Engine) StartDial(ctx context.Context, a TCPEndpoint, d *Dialer, src netip.Addr, dst netip.AddrPort, counters *Counters, done func(Result)) *Handle {
	db, ok := e.backend.(dialBackend)
	if !ok {
		c, err := d.Dial(ctx, src, dst)
		if err != nil {
			return e.failDial(a, counters, done, &ConnectError{Dst: dst, Err: err})
		}
		return e.Start(a, TCPEndpoint{TCPConn: c}, counters, done)
	}
	fb, err := d.connectStart(src, dst)
	if err != nil {
		return e.failDial(a, counters, done, dialError(dst, err))
	}
	if counters == nil {
		counters = new(Counters)
	}
	s, ok := e.begin(counters, done)
	if !ok {
		abortFD(fb)
		resetConn(a.TCPConn)
		s.deliver(Result{Err: ErrClosed})
		return s.handle()
	}
	fa, err := e.detach(a.TCPConn)
	if err != nil {
		abortFD(fb)
		resetConn(a.TCPConn)
		s.finish(fmt.Errorf("engine: take over socket: %w", err))
		return s.handle()
	}
	db.relayDial(fa, fb, dst, d.timeout(), s)
	return s.handle()
}

// failDial ends a relay whose connect failed before it began: a is reset
// and done receives err.
func (e *Engine) failDial(a TCPEndpoint, counters *Counters, done func(Result), err error) *Handle {
	s, ok := e.begin(counters, done)
	resetConn(a.TCPConn)
	if !ok {
		s.deliver(Result{Err: ErrClosed})
	} else {
		s.finish(err)
	}
	return s.handle()
}

// resetConn closes c so that its peer sees a reset.
func resetConn(c *net.TCPConn) error {
	_ = c.SetLinger(0)
	return c.Close()
}

// timeout is the connect timeout: Timeout, or ztunnel's 10s.
func (d *Dialer) timeout() time.Duration {
	if d.Timeout > 0 {
		return d.Timeout
	}
	return 10 * time.Second
}

// connectStart creates a non-blocking socket for dst with d's options,
// binds it to src when src is valid, and starts the connect; the socket
// it returns is connected or connecting. It runs under d.Control when set
// (the socket is created in the namespace Control enters).
func (d *Dialer) connectStart(src netip.Addr, dst netip.AddrPort) (int, error) {
	if d.Control == nil {
		return d.connectSocket(src, dst)
	}
	fd := -1
	var err error
	_, cerr := d.Control(func() (net.Conn, error) {
		fd, err = d.connectSocket(src, dst)
		return nil, err
	})
	if err == nil && cerr != nil {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
		return -1, cerr
	}
	return fd, err
}

func (d *Dialer) connectSocket(src netip.Addr, dst netip.AddrPort) (int, error) {
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	family, network := unix.AF_INET, "tcp4"
	if dst.Addr().Is6() {
		family, network = unix.AF_INET6, "tcp6"
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	fail := func(err error) (int, error) {
		_ = unix.Close(fd)
		return -1, err
	}
	if err := d.Options.apply(fd, network, false); err != nil {
		return fail(err)
	}
	// ztunnel sets TCP_NODELAY on every proxied socket (as Go does on every
	// TCP connection).
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return fail(os.NewSyscallError("setsockopt", err))
	}
	if src.IsValid() {
		if err := unix.Bind(fd, sockaddr(netip.AddrPortFrom(src, 0), family)); err != nil {
			return fail(os.NewSyscallError("bind", err))
		}
	}
	err = unix.Connect(fd, sockaddr(dst, family))
	switch err {
	case nil, unix.EINPROGRESS, unix.EINTR:
		// EINTR: the connect goes on asynchronously, as EINPROGRESS.
		return fd, nil
	}
	return fail(err)
}

// sockaddr converts ap for a socket of family.
func sockaddr(ap netip.AddrPort, family int) unix.Sockaddr {
	if family == unix.AF_INET {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}
