package nettest

import (
	"net"
	"testing"
)

// Listen returns a TCP listener on an ephemeral loopback port, closed when
// the test ends.
func Listen(t testing.TB) *net.TCPListener {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("nettest: listen: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// TCPPair returns both ends of a fresh loopback TCP connection, closed when
// the test ends: real sockets, for code that needs file descriptors,
// half-close or kernel buffering (net.Pipe has none of them).
func TCPPair(t testing.TB) (dialed, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("nettest: listen: %v", err)
	}
	defer ln.Close()
	// The dial completes from the listen backlog, so accepting after it
	// needs no goroutine.
	c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatalf("nettest: dial: %v", err)
	}
	s, err := ln.AcceptTCP()
	if err != nil {
		c.Close()
		t.Fatalf("nettest: accept: %v", err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}
