package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// soOriginalDst is SO_ORIGINAL_DST (and IP6T_SO_ORIGINAL_DST, same number),
// the netfilter getsockopt that reports where a REDIRECTed connection was headed.
const soOriginalDst = 80

// SocketOptions are the options applied to every socket the proxy creates.
// The zero value applies none of the optional ones.
type SocketOptions struct {
	// Mark is SO_MARK; 0 leaves the mark unset. In shared mode ztunnel marks
	// every socket with 1337 so the pod's capture rules let it through.
	Mark uint32
	// ReusePort sets SO_REUSEPORT on listeners so that a new daemon can take
	// over new connections while the old one drains, with a steering
	// program that sends every new connection to the newest listener of the
	// port (steerToNewest), so that the old one's queue empties before it
	// closes.
	ReusePort bool
	// Transparent sets IP_TRANSPARENT (and IPV6_TRANSPARENT), needed to bind a
	// foreign source address (original-source spoofing) and to accept
	// TPROXY-redirected connections.
	Transparent bool
	// KeepAlive configures TCP keepalive on proxied sockets; a zero Idle
	// disables it.
	KeepAlive KeepAlive
	// UserTimeout is TCP_USER_TIMEOUT on proxied sockets (listeners pass it
	// to the sockets they accept): how long sent data may stay
	// unacknowledged before the connection is dropped. Zero leaves the
	// kernel's default (USER_TIMEOUT_ENABLED).
	UserTimeout time.Duration
}

// KeepAlive mirrors ztunnel's KEEPALIVE_* settings.
type KeepAlive struct {
	Idle     time.Duration // KEEPALIVE_TIME, default 180s
	Interval time.Duration // KEEPALIVE_INTERVAL, default 180s
	Count    int           // KEEPALIVE_RETRIES, default 9
}

// DefaultKeepAlive is ztunnel's default keepalive.
var DefaultKeepAlive = KeepAlive{Idle: 180 * time.Second, Interval: 180 * time.Second, Count: 9}

// control returns a net.Dialer/ListenConfig Control function applying o.
func (o SocketOptions) control(listener bool) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = o.apply(int(fd), network, listener)
		})
		if err != nil {
			return err
		}
		return serr
	}
}

func (o SocketOptions) apply(fd int, network string, listener bool) error {
	if o.Mark != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(o.Mark)); err != nil {
			return fmt.Errorf("engine: set SO_MARK %d: %w", o.Mark, err)
		}
	}
	if listener && o.ReusePort {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			return fmt.Errorf("engine: set SO_REUSEPORT: %w", err)
		}
	}
	if o.KeepAlive.Idle > 0 {
		// Before connect, or on the listener: Linux copies a listener's
		// keepalive settings (and TCP_NODELAY) to every socket it accepts,
		// so accepted and dialed sockets need no setsockopt of their own.
		if err := setKeepAlive(fd, o.KeepAlive); err != nil {
			return err
		}
	}
	if err := setUserTimeout(fd, o.UserTimeout); err != nil { // usertimeout_linux.go
		return err
	}
	if o.Transparent {
		v6 := network == "tcp6" || network == "tcp"
		if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_TRANSPARENT, 1); err != nil {
			return fmt.Errorf("engine: set IP_TRANSPARENT: %w", err)
		}
		if v6 {
			// Best effort: a v4-only socket refuses the v6 option.
			_ = unix.SetsockoptInt(fd, unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
		}
	}
	return nil
}

// setKeepAlive enables keepalive on fd with ka's timing; a zero Interval
// or Count takes the defaults of net.KeepAliveConfig (15s, 9).
func setKeepAlive(fd int, ka KeepAlive) error {
	secs := func(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }
	interval, count := ka.Interval, ka.Count
	if interval <= 0 {
		interval = 15 * time.Second
	}
	if count <= 0 {
		count = 9
	}
	for _, o := range []struct {
		level, opt, v int
		name          string
	}{
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, secs(ka.Idle), "TCP_KEEPIDLE"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, secs(interval), "TCP_KEEPINTVL"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, count, "TCP_KEEPCNT"},
	} {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			return fmt.Errorf("engine: set %s: %w", o.name, err)
		}
	}
	return nil
}

// tuneConn sets TCP_NODELAY and keepalive on an established connection, as
// ztunnel does for every proxied socket.
func (o SocketOptions) tuneConn(c *net.TCPConn) error {
	if err := c.SetNoDelay(true); err != nil {
		return err
	}
	if o.KeepAlive.Idle <= 0 {
		return c.SetKeepAlive(false)
	}
	return c.SetKeepAliveConfig(net.KeepAliveConfig{
		Enable:   true,
		Idle:     o.KeepAlive.Idle,
		Interval: o.KeepAlive.Interval,
		Count:    o.KeepAlive.Count,
	})
}

// ErrNoOriginalDst is returned when a connection carries no netfilter
// original destination (it was not redirected).
var ErrNoOriginalDst = errors.New("engine: connection has no original destination")

// OriginalDst returns the destination a captured connection was headed to
// before the capture rules redirected it. A connection that was not
// redirected yields its local address, as ztunnel falls back to.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var dst netip.AddrPort
	var gerr error
	err = rc.Control(func(fd uintptr) {
		dst, gerr = originalDst(int(fd), local.Addr().Is6())
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	if gerr != nil {
		if errors.Is(gerr, unix.ENOENT) || errors.Is(gerr, unix.ENOPROTOOPT) {
			return local, nil
		}
		return netip.AddrPort{}, fmt.Errorf("engine: SO_ORIGINAL_DST: %w", gerr)
	}
	return dst, nil
}

func originalDst(fd int, v6 bool) (netip.AddrPort, error) {
	if v6 {
		// struct sockaddr_in6 is 28 bytes; IPv6Mreq (20 bytes) is too small,
		// so read it through the 32-byte IPv6MTUInfo shape.
		info, err := unix.GetsockoptIPv6MTUInfo(fd, unix.SOL_IPV6, soOriginalDst)
		if err != nil {
			return netip.AddrPort{}, err
		}
		// The raw port is in network byte order.
		var pb [2]byte
		binary.NativeEndian.PutUint16(pb[:], info.Addr.Port)
		port := binary.BigEndian.Uint16(pb[:])
		addr := netip.AddrFrom16(info.Addr.Addr).Unmap()
		return netip.AddrPortFrom(addr, port), nil
	}
	// struct sockaddr_in is 16 bytes, the size of IPv6Mreq's first fields.
	mreq, err := unix.GetsockoptIPv6Mreq(fd, unix.SOL_IP, soOriginalDst)
	if err != nil {
		return netip.AddrPort{}, err
	}
	port := binary.BigEndian.Uint16(mreq.Multiaddr[2:4])
	addr := netip.AddrFrom4([4]byte(mreq.Multiaddr[4:8]))
	return netip.AddrPortFrom(addr, port), nil
}
