package engine

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// steerToNewest attaches to a listening SO_REUSEPORT socket's group a
// one-instruction classic BPF program that sends every new connection to
// the socket at index 1 of the port's reuseport group, and so makes a
// daemon upgrade lossless without writing any sysctl.
//
// Why: during an upgrade two daemons' listeners share each pod port. Linux
// hashes new connections across them, so the old daemon's accept queue
// keeps filling until it closes its listener, and closing resets what is
// queued (net.ipv4.tcp_migrate_req would move it, but that sysctl must be
// written in each pod's netns, through /proc/sys, which Kubernetes mounts
// read-only in a non-privileged container).
//
// How: the program belongs to the port's group, so each daemon's listener
// attaches it once it has joined (a program attached before bind would be
// dropped on joining, and makes the bind fail), and the group's sockets sit
// in join order. Alone, a listener is index 0: the program's 1 is out of range
// and Linux falls back to hashing, which picks it. When the new daemon's
// listener joins it is index 1, so from that moment new connections go to
// it only, while the old daemon keeps accepting what it had already queued;
// by the time the old daemon drains and closes, its queue is empty. When it
// has closed, the new listener moves to index 0 and the group is back to
// one socket. Unprivileged (no capability needed), and a 1-instruction
// filter per SYN costs nothing measurable.
func steerToNewest(ln *net.TCPListener) error {
	rc, err := ln.SyscallConn()
	if err != nil {
		return fmt.Errorf("engine: SO_REUSEPORT steering program: %w", err)
	}
	prog := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 1}}
	fprog := &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, fprog)
	}); err != nil {
		serr = err
	}
	if serr != nil {
		return fmt.Errorf("engine: attach SO_REUSEPORT steering program: %w", serr)
	}
	return nil
}
