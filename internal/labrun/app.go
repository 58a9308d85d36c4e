package labrun

import (
	"fmt"
	"net/netip"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// EchoServer is a TCP application inside a pod: nettest's echo (it echoes
// every byte back, half-closes when the client does, records who connected
// so tests can check that the original source address was preserved, and
// can reset its connections).
type EchoServer = nettest.Server

// StartEcho listens on port on all of pod's addresses; the server's Addr is
// the pod's address, the one clients dial.
func StartEcho(pod *netnslab.Pod, port uint16) (*EchoServer, error) {
	ln, err := pod.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		return nil, fmt.Errorf("labrun: echo server in %s: %w", pod.Name, err)
	}
	s := nettest.ServeEcho(ln)
	s.Addr = netip.AddrPortFrom(pod.IP, port)
	return s, nil
}
