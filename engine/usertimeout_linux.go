package engine

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets TCP_USER_TIMEOUT on fd to d (rounded up to a
// millisecond); zero leaves the socket alone. Set on a listener, Linux
// copies it to every accepted socket, as it does keepalive.
func setUserTimeout(fd int, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(ms)); err != nil {
		return fmt.Errorf("engine: set TCP_USER_TIMEOUT %v: %w", d, err)
	}
	return nil
}
