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
