package engine

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Listen opens a TCP listener on addr with opts applied before bind, so that
// SO_REUSEPORT and IP_TRANSPARENT take effect. Keepalive is set on the
// listener itself: Linux copies it to every accepted socket, as Go copies
// TCP_NODELAY (on by default), so accepted connections need no further
// setsockopt (see Accepted). Call it on the goroutine (and OS thread) whose
// network namespace the listener must live in.
func Listen(ctx context.Context, addr string, opts SocketOptions) (*net.TCPListener, error) {
	lc := net.ListenConfig{Control: opts.control(true), KeepAlive: -1}
	// Plain TCP, as ztunnel listens: Go (1.24+) makes listeners MPTCP
	// sockets by default, which refuse most socket options (the
	// SO_REUSEPORT steering program among them) with EOPNOTSUPP.
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("engine: listen %s: %w", addr, err)
	}
	if opts.ReusePort {
		if err := steerToNewest(ln.(*net.TCPListener)); err != nil { // reuseport_linux.go
			ln.Close()
			return nil, err
		}
	}
	return ln.(*net.TCPListener), nil
}

// Dialer originates proxied connections.
type Dialer struct {
	// Options are applied to every dialed socket (mark, keepalive).
	Options SocketOptions
	// Timeout bounds the TCP connect; 0 means 10s, ztunnel's connect timeout.
	Timeout time.Duration
	// Control, if set, runs the dial itself, e.g. on a thread inside a pod's
	// network namespace. It must call dial and return its result.
	Control func(dial func() (net.Conn, error)) (net.Conn, error)
}

// Dial connects to dst. A valid src binds the socket to that address first;
// with Options.Transparent set this spoofs a foreign source address
// (ztunnel's original-source preservation).
func (d *Dialer) Dial(ctx context.Context, src netip.Addr, dst netip.AddrPort) (*net.TCPConn, error) {
	timeout := d.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	nd := net.Dialer{Timeout: timeout, KeepAlive: -1, Control: d.Options.control(false)}
	if src.IsValid() {
		nd.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	dial := func() (net.Conn, error) { return nd.DialContext(ctx, "tcp", dst.String()) }
	var c net.Conn
	var err error
	if d.Control != nil {
		c, err = d.Control(dial)
	} else {
		c, err = dial()
	}
	if err != nil {
		return nil, err
	}
	// Keepalive was set before connect (Options' control function) and Go
	// sets TCP_NODELAY on every TCP connection: nothing left to tune.
	return c.(*net.TCPConn), nil
}

// Accepted applies the per-connection options (TCP_NODELAY, keepalive) to an
// accepted connection. A connection accepted from a listener made by Listen
// with the same options already has them (copied from the listener), so the
// proxy does not call it; it serves listeners made otherwise.
func Accepted(c *net.TCPConn, opts SocketOptions) error {
	return opts.tuneConn(c)
}
