package peers

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// originalDst returns where a connection redirected by iptables (the pod's
// capture rules) was going: SO_ORIGINAL_DST, IPv4 only, as a naive proxy
// would do it.
func originalDst(c net.Conn) (string, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return "", fmt.Errorf("peers: original destination of a %T", c)
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return "", err
	}
	var (
		addr netip.AddrPort
		gerr error
	)
	err = rc.Control(func(fd uintptr) {
		// The kernel answers with a sockaddr_in; the IPv6 mreq getter is
		// the usual way to receive those 16 bytes.
		mreq, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			gerr = err
			return
		}
		b := mreq.Multiaddr
		addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4]))
	})
	if err != nil {
		return "", err
	}
	if gerr != nil {
		return "", fmt.Errorf("peers: SO_ORIGINAL_DST: %w", gerr)
	}
	return addr.String(), nil
}

// markControl sets SO_MARK on a socket before it connects, so that the
// pod's capture rules let the proxy's own connections through.
func markControl(mark int) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark)
		})
		if err != nil {
			return err
		}
		return serr
	}
}
