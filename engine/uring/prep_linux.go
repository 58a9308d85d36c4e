package uring

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The Prep functions fill an SQE from GetSQE for one operation. Pointers
// they store (buffers, timespecs, sockaddrs) must stay reachable Go heap
// memory until the operation's completion.

// PrepNop prepares a no-op.
func (s *SQE) PrepNop(userData uint64) {
	s.Opcode, s.Fd, s.UserData = OpNop, -1, userData
}

// PrepAccept prepares an accept on listening socket fd; with multishot it
// stays armed and completes once per accepted connection (Res is the new
// descriptor). Accepted sockets get flags (unix.SOCK_NONBLOCK,
// unix.SOCK_CLOEXEC).
func (s *SQE) PrepAccept(fd int, flags int, multishot bool, userData uint64) {
	s.Opcode, s.Fd, s.OpFlags, s.UserData = OpAccept, int32(fd), uint32(flags), userData
	if multishot {
		s.IoPrio |= AcceptMultishot
	}
}

// PrepPollAdd prepares a poll for events (unix.POLLIN...) on fd; with
// multishot it stays armed and completes on every wake-up, like an
// edge-triggered epoll registration (Res is the ready mask).
func (s *SQE) PrepPollAdd(fd int, events uint32, multishot bool, userData uint64) {
	s.Opcode, s.Fd, s.OpFlags, s.UserData = OpPollAdd, int32(fd), events, userData
	if multishot {
		s.Len = PollAddMulti
	}
}

// PrepPollRemove prepares the removal of the poll submitted with target.
func (s *SQE) PrepPollRemove(target, userData uint64) {
	s.Opcode, s.Fd, s.Addr, s.UserData = OpPollRemove, -1, target, userData
}

// PrepRecv prepares a recv into buf.
func (s *SQE) PrepRecv(fd int, buf []byte, flags int, userData uint64) {
	s.Opcode, s.Fd, s.OpFlags, s.UserData = OpRecv, int32(fd), uint32(flags), userData
	if len(buf) > 0 {
		s.Addr, s.Len = uint64(uintptr(unsafe.Pointer(&buf[0]))), uint32(len(buf))
	}
}

// PrepRecvBufferSelect prepares a recv into a buffer the kernel picks from
// provided-buffer group; with multishot it completes once per received
// chunk (the buffer id is in CQE.Flags >> CQEBufferShift).
func (s *SQE) PrepRecvBufferSelect(fd int, group uint16, multishot bool, userData uint64) {
	s.Opcode, s.Fd, s.UserData = OpRecv, int32(fd), userData
	s.Flags |= SQEBufferSelect
	s.BufIndex = group
	if multishot {
		s.IoPrio |= RecvMultishot
	}
}

// PrepSend prepares a send of buf.
func (s *SQE) PrepSend(fd int, buf []byte, flags int, userData uint64) {
	s.Opcode, s.Fd, s.OpFlags, s.UserData = OpSend, int32(fd), uint32(flags), userData
	if len(buf) > 0 {
		s.Addr, s.Len = uint64(uintptr(unsafe.Pointer(&buf[0]))), uint32(len(buf))
	}
}

// PrepRead prepares a read into buf at the file's position.
func (s *SQE) PrepRead(fd int, buf []byte, userData uint64) {
	s.Opcode, s.Fd, s.UserData = OpRead, int32(fd), userData
	s.Off = ^uint64(0) // -1: current position, as read(2)
	if len(buf) > 0 {
		s.Addr, s.Len = uint64(uintptr(unsafe.Pointer(&buf[0]))), uint32(len(buf))
	}
}

// PrepSplice prepares a splice of up to n bytes from fdIn to fdOut (one of
// them a pipe), at their current positions. The kernel runs every splice
// in an io-wq worker: arm a poll on a socket first so that a worker never
// waits for data.
func (s *SQE) PrepSplice(fdIn, fdOut int, n uint32, flags uint32, userData uint64) {
	s.Opcode, s.Fd, s.SpliceFdIn, s.Len, s.OpFlags, s.UserData = OpSplice, int32(fdOut), int32(fdIn), n, flags, userData
	s.Off = ^uint64(0)  // off_out -1
	s.Addr = ^uint64(0) // off_in -1
}

// PrepClose prepares a close of fd.
func (s *SQE) PrepClose(fd int, userData uint64) {
	s.Opcode, s.Fd, s.UserData = OpClose, int32(fd), userData
}

// PrepShutdown prepares a shutdown(fd, how).
func (s *SQE) PrepShutdown(fd int, how int, userData uint64) {
	s.Opcode, s.Fd, s.Len, s.UserData = OpShutdown, int32(fd), uint32(how), userData
}

// PrepTimeout prepares a timeout that completes (Res -ETIME) after ts, or
// earlier (Res 0) once count other completions have arrived (count 0: only
// the time). ts is read when the entry is submitted.
func (s *SQE) PrepTimeout(ts *unix.Timespec, count uint32, flags uint32, userData uint64) {
	s.Opcode, s.Fd, s.UserData = OpTimeout, -1, userData
	s.Addr, s.Len, s.Off, s.OpFlags = uint64(uintptr(unsafe.Pointer(ts))), 1, uint64(count), flags
}

// PrepCancel prepares the cancellation of the request submitted with
// target (Res: 0, -ENOENT if none, -EALREADY if it is running).
func (s *SQE) PrepCancel(target uint64, flags uint32, userData uint64) {
	s.Opcode, s.Fd, s.Addr, s.OpFlags, s.UserData = OpAsyncCancel, -1, target, flags, userData
}

// PrepCancelFD prepares the cancellation of every request on fd (Res: how
// many were cancelled, or -ENOENT).
func (s *SQE) PrepCancelFD(fd int, userData uint64) {
	s.Opcode, s.Fd, s.OpFlags, s.UserData = OpAsyncCancel, int32(fd), CancelFD|CancelAll, userData
}
