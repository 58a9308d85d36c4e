package nettest

import (
	"io"
	"net"
	"testing"
)

// Echo is the echo application's handler (for Serve and Handle): it copies
// c to itself; on the client's half-close it half-closes too, then waits
// for the client to finish so the close is orderly.
func Echo(c net.Conn) {
	if _, err := io.Copy(c, c); err != nil {
		return
	}
	if hc, ok := c.(interface{ CloseWrite() error }); ok {
		hc.CloseWrite()
		io.Copy(io.Discard, c)
	}
}

// ServeEcho serves echo on ln until Close, outside tests (the lab's apps).
func ServeEcho(ln net.Listener) *Server { return Serve(ln, Echo) }

// StartEcho serves echo on a fresh loopback port until the test ends.
func StartEcho(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("nettest: listen: %v", err)
	}
	return Handle(t, ln, Echo)
}
