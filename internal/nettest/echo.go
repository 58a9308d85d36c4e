package nettest

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
)

// EchoServer is a TCP application that echoes every byte back and
// half-closes when its client does. It records who connected, so tests can
// check which source address reached it, and can reset its connections.
type EchoServer struct {
	ln net.Listener
	// Addr is the address clients dial: the listener's, unless the caller
	// (whose listener is on a wildcard address) set it before handing the
	// server out.
	Addr netip.AddrPort

	mu    sync.Mutex // guards the following fields
	peers []netip.AddrPort
	conns map[net.Conn]struct{}

	wg sync.WaitGroup // the accept loop and one per connection
}

// ServeEcho serves echo on ln until Close. It takes no testing.TB so apps
// outside tests (the lab's, internal/labrun) can run it; tests use Echo or
// StartEcho.
func ServeEcho(ln net.Listener) *EchoServer {
	s := &EchoServer{ln: ln, conns: map[net.Conn]struct{}{}}
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil {
		s.Addr = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	s.wg.Go(s.serve)
	return s
}

// Echo serves echo on ln until the test ends; by then every goroutine the
// server started has returned.
func Echo(t testing.TB, ln net.Listener) *EchoServer {
	t.Helper()
	s := ServeEcho(ln)
	t.Cleanup(func() { s.Close() })
	return s
}

// StartEcho serves echo on a fresh loopback port until the test ends.
func StartEcho(t testing.TB) *EchoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("nettest: listen: %v", err)
	}
	return Echo(t, ln)
}

func (s *EchoServer) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
			s.peers = append(s.peers, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() { s.echo(c) })
	}
}

// echo copies c to itself; on the client's half-close it half-closes too,
// then waits for the client to finish so the close is orderly.
func (s *EchoServer) echo(c net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	if _, err := io.Copy(c, c); err != nil {
		return
	}
	if hc, ok := c.(interface{ CloseWrite() error }); ok {
		hc.CloseWrite()
		io.Copy(io.Discard, c)
	}
}

// Peers returns the source addresses of every accepted connection.
func (s *EchoServer) Peers() []netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]netip.AddrPort(nil), s.peers...)
}

// Conns returns how many connections are open now.
func (s *EchoServer) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// ResetAll aborts every open connection with a TCP RST.
func (s *EchoServer) ResetAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// Close stops the server, ends its connections and waits for its
// goroutines. It may be called more than once.
func (s *EchoServer) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
