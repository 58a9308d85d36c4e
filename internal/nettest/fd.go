package nettest

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// DupFD duplicates c's descriptor (close-on-exec; the duplicate shares the
// open file, already non-blocking). Closing c afterwards takes the socket
// out of the runtime's poller, which is what the engine's detach does before
// a loop owns a socket; DupFD leaves that close to the caller, so a caller
// that may still refuse the descriptor keeps c usable.
func DupFD(c *net.TCPConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	return fd, derr
}

// DetachFD does to c what the engine does before an event loop takes a
// socket over: it duplicates the descriptor and closes c. The test owns the
// returned descriptor, which is closed when the test ends.
func DetachFD(t testing.TB, c *net.TCPConn) int {
	t.Helper()
	fd, err := DupFD(c)
	if err != nil {
		t.Fatalf("nettest: dup: %v", err)
	}
	if err := c.Close(); err != nil {
		_ = unix.Close(fd)
		t.Fatalf("nettest: close after dup: %v", err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	return fd
}
