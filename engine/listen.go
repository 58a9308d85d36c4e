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
	ln, err := lc.Listen(ctx, ListenNetwork(addr), addr)
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

// ListenNetwork is the network to listen on addr with: "tcp4" when its
// host is an IPv4 address, else "tcp". Go listens on 0.0.0.0 with "tcp"
// through a dual-stack IPv6 socket, which would take IPv6 connections too:
// with IPV6_ENABLED=false the wildcard is 0.0.0.0 and must mean IPv4 only,
// as it does for ztunnel.
func ListenNetwork(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "tcp"
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
		return "tcp4"
	}
	return "tcp"
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
	dctx, stop := dialContext(ctx)
	defer stop()
	dial := func() (net.Conn, error) { return nd.DialContext(dctx, "tcp", dst.String()) }
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

// dialContext returns the context to dial under: ctx's values and
// deadline, cancelled when ctx is, and a stop that releases it (call it once
// the dial is over). net.Dialer derives a context.WithDeadline from the
// context it is given, and that derivation (like context.AfterFunc) asks the
// parent for its Done channel before it looks for an AfterFunc method: an
// HBONE stream's context makes that channel on demand and keeps it for the
// stream's life, ~100 B per idle relayed stream. Dialing under
// context.WithoutCancel and binding ctx's cancellation through ctx's own
// AfterFunc, where it has one, never asks for it.
func dialContext(ctx context.Context) (context.Context, func()) {
	if ctx.Err() != nil {
		// Already over: the dial fails at once with ctx's own error.
		return ctx, func() {}
	}
	af, ok := ctx.(interface{ AfterFunc(func()) func() bool })
	if !ok {
		// A context without the method: deriving from it directly costs
		// what net.Dialer's own derivation would.
		return ctx, func() {}
	}
	var dctx context.Context
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok {
		dctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl)
	} else {
		dctx, cancel = context.WithCancel(context.WithoutCancel(ctx))
	}
	stopAfter := af.AfterFunc(cancel)
	return dctx, func() {
		stopAfter()
		cancel()
	}
}

// Accepted applies the per-connection options (TCP_NODELAY, keepalive) to an
// accepted connection. A connection accepted from a listener made by Listen
// with the same options already has them (copied from the listener), so the
// proxy does not call it; it serves listeners made otherwise.
func Accepted(c *net.TCPConn, opts SocketOptions) error {
	return opts.tuneConn(c)
}
