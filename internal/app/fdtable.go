package app

import (
	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/fdbudget"
)

// FDTableCap bounds the descriptor table GrowFDTable sizes at start: 65,536
// slots (the kernel keeps 8 bytes and 2 bits a slot, ~530 KiB charged to the
// daemon's cgroup, outside its RSS), enough for a node proxy's 20,000
// connections and its pods' listeners. Past it the table grows as before.
const FDTableCap = 1 << 16

// GrowFDTable sizes the process's descriptor table, once at start, for
// min(RLIMIT_NOFILE, FDTableCap) descriptors, and returns that size (0 when
// it could not). The kernel grows the table when a new descriptor passes
// its size (at 64, 128, 256, ... descriptors) and, in a process with more
// than one thread (every Go process), waits out an RCU grace period before
// it frees the old one: 15 ms on this VM's 2 vCPUs, more under load, inside
// whatever socket, accept or dup call crossed the boundary. In the daemon
// that was the ZDS add of the pod whose listeners crossed it (the Node
// scenario's add-to-serving tail: one stall per doubling, at 256, 512, 1024
// and 2048 descriptors) or a connection's accept. The table never shrinks,
// so growing it up front pays that wait once, before anything is served.
// F_DUPFD takes the lowest free descriptor at or above its argument, so no
// open descriptor is touched.
func GrowFDTable() int {
	n := min(fdbudget.NoFileLimit(), FDTableCap)
	if n <= 0 {
		return 0
	}
	fd, err := unix.FcntlInt(0, unix.F_DUPFD_CLOEXEC, n-1)
	if err != nil {
		// Descriptor 0 closed (or not a descriptor): any other will do.
		r, werr := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if werr != nil {
			return 0
		}
		fd, err = unix.FcntlInt(uintptr(r), unix.F_DUPFD_CLOEXEC, n-1)
		unix.Close(r)
		if err != nil {
			return 0
		}
	}
	unix.Close(fd)
	return n
}
