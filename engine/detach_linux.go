package engine

import (
	"net"

	"golang.org/x/sys/unix"
)

// detach takes a socket away from Go's netpoller: it duplicates the
// descriptor (the duplicate shares the open file, already non-blocking) and
// closes the *net.TCPConn, which removes the original from the runtime's
// epoll set. The caller owns the returned descriptor.
func detach(c *net.TCPConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(f uintptr) {
		fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	_ = c.Close()
	return fd, nil
}

// abortFD closes a socket so that its peer sees a reset (SO_LINGER 0).
func abortFD(fd int) {
	if fd < 0 {
		return
	}
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	_ = unix.Close(fd)
}

// WasReset reports whether c's connection is in state CLOSE: torn down by
// a reset (or given up on, e.g. after a retransmission timeout) rather than
// ended by a FIN, which leaves it in CLOSE_WAIT until this side shuts down
// too. A reader that saw EOF after a write on the same socket failed tells
// a reset from a FIN with it (only while this side has sent no FIN: that
// too leads to CLOSE). Any failure to look says no.
func WasReset(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	_ = rc.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		closed = err == nil && info.State == unix.BPF_TCP_CLOSE
	})
	return closed
}

// sockError returns a socket's pending error (SO_ERROR), nil if none.
func sockError(fd int) error {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if v != 0 {
		return unix.Errno(v)
	}
	return nil
}
