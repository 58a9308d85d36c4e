package inpod

import (
	"fmt"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/inpod/netns"
)

// NetnsID identifies a network namespace: two handles are the same
// namespace when device and inode match (what ztunnel, cilium and
// vishvananda/netns compare).
type NetnsID struct {
	Dev, Ino uint64
}

// String formats the id as dev:inode.
func (id NetnsID) String() string { return fmt.Sprintf("%d:%d", id.Dev, id.Ino) }

// Netns is an open handle on a network namespace, typically a pod's as
// received from the CNI agent. It owns its file descriptor until Close.
type Netns struct {
	f  *os.File
	fd int // f's descriptor, read once: os.File.Fd is not free
	id NetnsID
	// home is the namespace Run returns to, held open by the Manager so
	// that each Run saves opening /proc/thread-self/ns/net (about half its
	// cost); -1 opens it per call.
	home int
}

// nsGetNSType is NS_GET_NSTYPE, _IO(0xb7, 0x3) from linux/nsfs.h.
const nsGetNSType = 0xb703

// NewNetns takes ownership of f, which must be a network namespace (an
// nsfs file such as /proc/PID/ns/net or /run/netns/NAME). f is closed when
// it is not one.
func NewNetns(f *os.File) (*Netns, error) {
	n := &Netns{f: f, fd: int(f.Fd()), home: -1}
	if err := checkNetns(n.fd); err != nil {
		f.Close()
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(n.fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("inpod: stat netns: %w", err)
	}
	n.id = NetnsID{Dev: st.Dev, Ino: st.Ino}
	return n, nil
}

// OpenNetns opens the network namespace at path.
func OpenNetns(path string) (*Netns, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("inpod: open netns: %w", err)
	}
	return NewNetns(f)
}

// checkNetns rejects a descriptor that is not a network namespace, so a
// wrong fd from the agent fails its Add instead of every later setns.
func checkNetns(fd int) error {
	t, err := unix.IoctlRetInt(fd, nsGetNSType)
	if err == nil {
		if t != unix.CLONE_NEWNET {
			return fmt.Errorf("inpod: descriptor is a namespace of type %#x, not a network namespace", t)
		}
		return nil
	}
	// Kernels before 4.11 lack NS_GET_NSTYPE: accept any nsfs (or old
	// procfs) file, as ztunnel does.
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return fmt.Errorf("inpod: statfs netns: %w", err)
	}
	if sfs.Type != unix.NSFS_MAGIC && sfs.Type != unix.PROC_SUPER_MAGIC {
		return fmt.Errorf("inpod: descriptor is not a namespace (filesystem %#x)", sfs.Type)
	}
	return nil
}

// ID returns the namespace's identity.
func (n *Netns) ID() NetnsID { return n.id }

// File returns the namespace's file; it stays owned by n.
func (n *Netns) File() *os.File { return n.f }

// Close releases the descriptor. Sockets already created inside the
// namespace keep it alive.
func (n *Netns) Close() error { return n.f.Close() }

// Run calls fn on an OS thread switched into the namespace and returns its
// error (inpod/netns.Run, whose doc says why that is safe in a Go
// process). Sockets fn creates (directly, on its own goroutine) belong to
// the namespace for life, wherever they are used afterwards: that is how a
// proxy's listeners and dials end up inside its pod. The thread returns to
// the daemon's namespace, which the Manager holds open (else it is opened
// per call). Concurrent calls are fine; a panic in fn is re-raised in the
// caller.
func (n *Netns) Run(fn func() error) error {
	switches.Add(1)
	return netns.Run(n.fd, n.home, n.id.String(), fn)
}

// switches counts the calls of Netns.Run in this process.
var switches atomic.Uint64

// Switches returns how many times Netns.Run has been called in this
// process: each call switches an OS thread into a namespace and back. A
// pod add makes one (Manager, SocketOpener); each connection a pod's proxy
// dials makes one more. Tests read it across an add.
func Switches() uint64 { return switches.Load() }

// CheckPrivileges verifies at startup what shared mode needs, so that a
// missing capability fails the daemon at once rather than every pod later
// (ztunnel's verify_syscalls): entering a network namespace (setns, which
// needs CAP_SYS_ADMIN) and marking a socket (SO_MARK, which needs
// CAP_NET_ADMIN or CAP_NET_RAW). mark 0 checks with 1337.
func CheckPrivileges(mark uint32) error {
	// thread-self, not self: /proc/self names the main thread, which a
	// goroutine that exited locked may have left elsewhere.
	own, err := OpenNetns("/proc/thread-self/ns/net")
	if err != nil {
		return err
	}
	defer own.Close()
	if err := own.Run(func() error { return nil }); err != nil {
		return fmt.Errorf("inpod: cannot enter network namespaces (the daemon needs CAP_SYS_ADMIN): %w", err)
	}
	if mark == 0 {
		mark = 1337
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("inpod: socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(mark)); err != nil {
		return fmt.Errorf("inpod: cannot set SO_MARK %d (the daemon needs CAP_NET_ADMIN or CAP_NET_RAW): %w", mark, err)
	}
	return nil
}
