package nettest

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
)

// Server runs a handler for every connection accepted on a listener, each
// in a goroutine of its own, until Close: the accept loop every test app
// (echo, a server that answers with its name, one that reads a PROXY
// header) would otherwise write again. It records who connected.
type Server struct {
	ln     net.Listener
	handle func(net.Conn)
	// Addr is the address clients dial: the listener's, unless the caller
	// (whose listener is on a wildcard address) set it before handing the
	// server out.
	Addr netip.AddrPort

	mu    sync.Mutex // guards the following fields
	peers []netip.AddrPort
	conns map[net.Conn]struct{}

	wg sync.WaitGroup // the accept loop and one per connection
}

// Serve runs handle for each connection accepted on ln until Close; the
// connection is closed when handle returns. It takes no testing.TB so apps
// outside tests (the lab's) can run it; tests use Handle.
func Serve(ln net.Listener, handle func(net.Conn)) *Server {
	s := &Server{ln: ln, handle: handle, conns: map[net.Conn]struct{}{}}
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil {
		s.Addr = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	s.wg.Go(s.accept)
	return s
}

// Handle is Serve until the test ends; by then every goroutine the server
// started has returned.
func Handle(t testing.TB, ln net.Listener, handle func(net.Conn)) *Server {
	t.Helper()
	s := Serve(ln, handle)
	t.Cleanup(func() { s.Close() })
	return s
}

func (s *Server) accept() {
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
		s.wg.Go(func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			s.handle(c)
		})
	}
}

// Peers returns the source addresses of every accepted connection.
func (s *Server) Peers() []netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]netip.AddrPort(nil), s.peers...)
}

// Conns returns how many connections are open now.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// ResetAll aborts every open connection with a TCP RST.
func (s *Server) ResetAll() {
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
func (s *Server) Close() error {
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

// ServeFunc runs fn with a new loopback listener until the test ends
// (cancelling its context then, and waiting for it to return) and returns
// the listener's address: for servers that run their own accept loop (the
// load generator's, the benchmark peers'). An error fn returns fails the
// test.
func ServeFunc(t testing.TB, fn func(ctx context.Context, ln net.Listener) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := fn(ctx, ln); err != nil {
			t.Errorf("serve %s: %v", ln.Addr(), err)
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return ln.Addr().String()
}
