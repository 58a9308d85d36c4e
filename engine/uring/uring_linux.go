package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Opcodes (enum io_uring_op) the binding prepares.
const (
	OpNop         = 0
	OpPollAdd     = 6
	OpPollRemove  = 7
	OpTimeout     = 11
	OpAccept      = 13
	OpAsyncCancel = 14
	OpClose       = 19
	OpRead        = 22
	OpWrite       = 23
	OpSend        = 26
	OpRecv        = 27
	OpSplice      = 30
	OpShutdown    = 34
	OpMsgRing     = 40
)

// SQE flags.
const (
	SQEFixedFile      = 1 << 0
	SQEIODrain        = 1 << 1
	SQEIOLink         = 1 << 2
	SQEIOHardlink     = 1 << 3
	SQEAsync          = 1 << 4
	SQEBufferSelect   = 1 << 5
	SQECQESkipSuccess = 1 << 6
)

// Setup flags.
const (
	SetupCQSize       = 1 << 3
	SetupClamp        = 1 << 4
	SetupRDisabled    = 1 << 6
	SetupSubmitAll    = 1 << 7
	SetupCoopTaskrun  = 1 << 8
	SetupSingleIssuer = 1 << 12
	SetupDeferTaskrun = 1 << 13
)

// Feature bits reported by the kernel.
const (
	FeatSingleMmap = 1 << 0
	FeatNoDrop     = 1 << 1
	FeatFastPoll   = 1 << 5
	FeatExtArg     = 1 << 8
)

// CQE flags.
const (
	CQEFBuffer   = 1 << 0
	CQEFMore     = 1 << 1
	CQEFSockNone = 1 << 2
	// CQEBufferShift is where a selected buffer's id sits in CQE.Flags.
	CQEBufferShift = 16
)

// Operation-specific flags.
const (
	PollAddMulti      = 1 << 0 // in SQE.Len of a poll
	AcceptMultishot   = 1 << 0 // in SQE.IoPrio of an accept
	RecvMultishot     = 1 << 1 // in SQE.IoPrio of a recv
	RecvSendPollFirst = 1 << 0 // in SQE.IoPrio of a recv/send
	TimeoutAbs        = 1 << 0
	TimeoutMultishot  = 1 << 6
	CancelAll         = 1 << 0
	CancelFD          = 1 << 1
	CancelAny         = 1 << 2
)

const (
	enterGetEvents = 1 << 0
	enterExtArg    = 1 << 3

	sqCQOverflow = 1 << 1

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000
)

// SQE is a submission queue entry (struct io_uring_sqe, 64 bytes). The
// unions of the C struct are reduced to the names the engine uses.
type SQE struct {
	Opcode      uint8
	Flags       uint8
	IoPrio      uint16
	Fd          int32
	Off         uint64 // off, addr2
	Addr        uint64 // addr, splice_off_in
	Len         uint32
	OpFlags     uint32 // poll32_events, timeout_flags, accept_flags, cancel_flags, splice_flags, msg_flags...
	UserData    uint64
	BufIndex    uint16 // buf_index, buf_group
	Personality uint16
	SpliceFdIn  int32 // splice_fd_in, file_index
	Addr3       uint64
	_           uint64
}

// CQE is a completion queue entry (struct io_uring_cqe, 16 bytes).
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// More reports whether a multishot request stays armed after this CQE.
func (c *CQE) More() bool { return c.Flags&CQEFMore != 0 }

// Err returns the CQE's result as an error: nil for Res >= 0.
func (c *CQE) Err() error {
	if c.Res >= 0 {
		return nil
	}
	return unix.Errno(-c.Res)
}

type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

type params struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFd uint32
	Resv                                                                   [3]uint32
	SQOff                                                                  sqringOffsets
	CQOff                                                                  cqringOffsets
}

type geteventsArg struct {
	Sigmask   uint64
	SigmaskSz uint32
	MinWait   uint32
	Ts        uint64
}

// Config configures a ring. The zero value asks for 256 entries and no
// special flags.
type Config struct {
	// Entries is the submission queue size (rounded up to a power of two by
	// the kernel); 0 means 256.
	Entries uint32
	// CQEntries sizes the completion queue; 0 lets the kernel choose (twice
	// Entries).
	CQEntries uint32
	// Flags are Setup* flags.
	Flags uint32
}

// Ring is one io_uring instance.
type Ring struct {
	fd       int
	flags    uint32
	features uint32

	sqRing, cqRing, sqesMem []byte

	sqHead, sqTail, sqFlags *uint32
	sqMask, sqEntries       uint32
	sqes                    []SQE
	sqeTail                 uint32 // next SQE handed out; published by flush

	cqHead, cqTail, cqOverflow *uint32
	cqMask, cqEntries          uint32
	cqes                       []CQE

	// Kept on the heap for io_uring_enter's extended argument.
	arg *geteventsArg
	ts  *unix.Timespec
}

// ErrRingFull is returned by GetSQE's callers when the submission queue has
// no free entry even after a submit.
var ErrRingFull = errors.New("uring: submission queue full")

// New sets up a ring. An error wrapping unix.ENOSYS or unix.EPERM means the
// kernel (or a seccomp profile, or kernel.io_uring_disabled) refuses
// io_uring.
func New(cfg Config) (*Ring, error) {
	if cfg.Entries == 0 {
		cfg.Entries = 256
	}
	p := params{Flags: cfg.Flags}
	if cfg.CQEntries != 0 {
		p.Flags |= SetupCQSize
		p.CQEntries = cfg.CQEntries
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(cfg.Entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("uring: io_uring_setup: %w", errno)
	}
	r := &Ring{fd: int(fd), flags: p.Flags, features: p.Features, arg: new(geteventsArg), ts: new(unix.Timespec)}
	if err := r.mmap(&p); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Ring) mmap(p *params) error {
	sqSize := int(p.SQOff.Array + p.SQEntries*4)
	cqSize := int(p.CQOff.CQEs + p.CQEntries*uint32(unsafe.Sizeof(CQE{})))
	single := p.Features&FeatSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	r.sqRing, err = unix.Mmap(r.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mmap sq ring: %w", err)
	}
	if single {
		r.cqRing = r.sqRing
	} else if r.cqRing, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("uring: mmap cq ring: %w", err)
	}
	sqesSize := int(p.SQEntries) * int(unsafe.Sizeof(SQE{}))
	if r.sqesMem, err = unix.Mmap(r.fd, offSQEs, sqesSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("uring: mmap sqes: %w", err)
	}
	sq := unsafe.Pointer(&r.sqRing[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.SQOff.Head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.SQOff.Tail))
	r.sqFlags = (*uint32)(unsafe.Add(sq, p.SQOff.Flags))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.SQOff.RingMask))
	r.sqEntries = *(*uint32)(unsafe.Add(sq, p.SQOff.RingEntries))
	// Map every ring slot to the SQE of the same index once; the SQE to
	// fill is then simply tail & mask.
	array := unsafe.Slice((*uint32)(unsafe.Add(sq, p.SQOff.Array)), r.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.sqes = unsafe.Slice((*SQE)(unsafe.Pointer(&r.sqesMem[0])), r.sqEntries)
	r.sqeTail = atomic.LoadUint32(r.sqTail)

	cq := unsafe.Pointer(&r.cqRing[0])
	r.cqHead = (*uint32)(unsafe.Add(cq, p.CQOff.Head))
	r.cqTail = (*uint32)(unsafe.Add(cq, p.CQOff.Tail))
	r.cqOverflow = (*uint32)(unsafe.Add(cq, p.CQOff.Overflow))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.CQOff.RingMask))
	r.cqEntries = *(*uint32)(unsafe.Add(cq, p.CQOff.RingEntries))
	r.cqes = unsafe.Slice((*CQE)(unsafe.Add(cq, p.CQOff.CQEs)), r.cqEntries)
	return nil
}

// Fd returns the ring's descriptor (pollable: readable while completions
// are waiting).
func (r *Ring) Fd() int { return r.fd }

// Features returns the kernel's feature bits (Feat*).
func (r *Ring) Features() uint32 { return r.features }

// Flags returns the setup flags the ring was created with.
func (r *Ring) Flags() uint32 { return r.flags }

// Close unmaps the rings and closes the descriptor; the kernel cancels what
// is still in flight.
func (r *Ring) Close() error {
	var errs []error
	if r.sqesMem != nil {
		errs = append(errs, unix.Munmap(r.sqesMem))
	}
	if r.cqRing != nil && (r.sqRing == nil || unsafe.SliceData(r.cqRing) != unsafe.SliceData(r.sqRing)) {
		errs = append(errs, unix.Munmap(r.cqRing))
	}
	if r.sqRing != nil {
		errs = append(errs, unix.Munmap(r.sqRing))
	}
	r.sqesMem, r.cqRing, r.sqRing, r.sqes, r.cqes = nil, nil, nil, nil, nil
	if r.fd >= 0 {
		errs = append(errs, unix.Close(r.fd))
		r.fd = -1
	}
	return errors.Join(errs...)
}

// GetSQE returns a zeroed submission entry to fill, or nil when the queue
// is full (submit, then try again). The entry is published by the next
// Submit.
func (r *Ring) GetSQE() *SQE {
	head := atomic.LoadUint32(r.sqHead) // acquire: the kernel is done with older entries
	if r.sqeTail-head >= r.sqEntries {
		return nil
	}
	sqe := &r.sqes[r.sqeTail&r.sqMask]
	*sqe = SQE{}
	r.sqeTail++
	return sqe
}

// Pending reports how many entries were filled and not yet submitted.
func (r *Ring) Pending() uint32 {
	return r.sqeTail - atomic.LoadUint32(r.sqHead)
}

// flush publishes the filled entries to the kernel and returns how many are
// waiting for it.
func (r *Ring) flush() uint32 {
	// release: the entries' contents are visible before the new tail.
	atomic.StoreUint32(r.sqTail, r.sqeTail)
	return r.sqeTail - atomic.LoadUint32(r.sqHead)
}

// Submit hands the filled entries to the kernel without waiting and runs
// deferred completion work, so completions become visible.
func (r *Ring) Submit() (int, error) {
	return r.enter(r.flush(), 0, enterGetEvents, nil)
}

// SubmitAndWait submits and waits until at least wait completions are
// ready, or timeout passes (negative: no limit). A timeout is not an error.
func (r *Ring) SubmitAndWait(wait uint32, timeout time.Duration) (int, error) {
	n := r.flush()
	if timeout < 0 {
		return r.enter(n, wait, enterGetEvents, nil)
	}
	*r.ts = unix.NsecToTimespec(int64(timeout))
	*r.arg = geteventsArg{Ts: uint64(uintptr(unsafe.Pointer(r.ts)))}
	got, err := r.enter(n, wait, enterGetEvents|enterExtArg, r.arg)
	if err == unix.ETIME {
		return got, nil
	}
	return got, err
}

func (r *Ring) enter(submit, wait uint32, flags uint32, arg *geteventsArg) (int, error) {
	var argp, argsz uintptr
	if arg != nil {
		argp, argsz = uintptr(unsafe.Pointer(arg)), unsafe.Sizeof(*arg)
	}
	for {
		var n uintptr
		var errno unix.Errno
		if wait == 0 {
			// Cannot block: skip the scheduler's syscall bookkeeping.
			n, _, errno = unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(submit), 0, uintptr(flags), argp, argsz)
		} else {
			n, _, errno = unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(submit), uintptr(wait), uintptr(flags), argp, argsz)
		}
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			if wait > 0 {
				// Let the caller look at what has completed.
				return 0, nil
			}
			continue
		}
		return int(n), errno
	}
}

// Ready reports how many completions are waiting.
func (r *Ring) Ready() uint32 {
	return atomic.LoadUint32(r.cqTail) - *r.cqHead
}

// Reap copies up to len(cqes) waiting completions into cqes, frees their
// slots and returns how many it copied.
func (r *Ring) Reap(cqes []CQE) int {
	head := *r.cqHead // only this goroutine writes the head
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for head+uint32(n) != tail && n < len(cqes) {
		cqes[n] = r.cqes[(head+uint32(n))&r.cqMask]
		n++
	}
	if n > 0 {
		// release: the copies are done before the kernel may reuse the slots.
		atomic.StoreUint32(r.cqHead, head+uint32(n))
	}
	return n
}

// Overflowed reports whether completions overflowed the CQ ring (they are
// kept by the kernel with FeatNoDrop and flushed by the next enter).
func (r *Ring) Overflowed() bool {
	return atomic.LoadUint32(r.sqFlags)&sqCQOverflow != 0
}
