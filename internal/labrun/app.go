package labrun

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// EchoServer is a TCP application inside a pod: it echoes every byte back and
// half-closes when the client does. It records who connected, so tests can
// check that the original source address was preserved.
type EchoServer struct {
	ln   net.Listener
	Addr netip.AddrPort

	mu    sync.Mutex // guards peers and conns
	peers []netip.AddrPort
	conns map[net.Conn]struct{}

	wg sync.WaitGroup
}

// StartEcho listens on port on all of pod's addresses.
func StartEcho(pod *netnslab.Pod, port uint16) (*EchoServer, error) {
	ln, err := pod.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		return nil, fmt.Errorf("labrun: echo server in %s: %w", pod.Name, err)
	}
	s := &EchoServer{ln: ln, Addr: netip.AddrPortFrom(pod.IP, port), conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *EchoServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		ap := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		s.mu.Lock()
		s.peers = append(s.peers, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			_, err := io.Copy(c, c)
			if err == nil {
				c.(*net.TCPConn).CloseWrite()
				// Wait for the client to finish so the close is orderly.
				io.Copy(io.Discard, c)
			}
		}()
	}
}

// Peers returns the source addresses of every accepted connection.
func (s *EchoServer) Peers() []netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]netip.AddrPort(nil), s.peers...)
}

// ResetAll aborts every open connection with a TCP RST.
func (s *EchoServer) ResetAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
}

// Close stops the server and ends its connections.
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
