package engine

import "syscall"

// DialControl returns a net.Dialer Control function applying o's mark and
// transparency to sockets the daemon dials outside the data path (the xDS
// and CA clients): inside a captured pod's namespace they need the mark too,
// or the pod's own capture rules would redirect them back to the proxy.
func (o SocketOptions) DialControl() func(network, address string, c syscall.RawConn) error {
	return o.control(false)
}
