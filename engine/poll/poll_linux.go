package poll

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Event bits, as epoll defines them.
const (
	In    = unix.EPOLLIN
	Out   = unix.EPOLLOUT
	RDHup = unix.EPOLLRDHUP
	Err   = unix.EPOLLERR
	Hup   = unix.EPOLLHUP
	// ET requests edge-triggered notification for a descriptor.
	ET = unix.EPOLLET
)

// wakeTag marks the eventfd's registration; callers' tags must differ.
const wakeTag = ^uint64(0)

// ErrClosed is returned by operations on a closed Poller.
var ErrClosed = errors.New("poll: poller closed")

// Event is one readiness notification: the epoll event bits and the tag the
// descriptor was registered with.
type Event struct {
	Events uint32
	Tag    uint64
}

// Poller is an epoll instance plus a wake-up eventfd.
type Poller struct {
	epfd int
	efd  int
	// pending is 1 while a wake-up has been written and not yet consumed by
	// Wait; it makes concurrent Wake calls cost one eventfd write.
	pending atomic.Uint32
	closed  atomic.Bool
	raw     []unix.EpollEvent

	// For WaitPark: the epoll descriptor as a pollable file, so the
	// runtime's netpoller can park the waiting goroutine until the epoll
	// instance has events.
	file   *os.File
	rc     syscall.RawConn
	tryFn  func(fd uintptr) bool // p.try, bound once so parking does not allocate
	tryN   int
	tryErr error
	// parkWake is set once WaitPark made the descriptor pollable: from then
	// on Wake readies the parked owner through the runtime (a read deadline
	// in the past) instead of writing the eventfd, which the runtime would
	// notice only at its next netpoll, late when every P is busy.
	parkWake atomic.Bool
	// park is the file a parked owner waits on, for Wake's deadline: file
	// under WaitPark, the park's own duplicate under WaitParkOnce.
	park atomic.Pointer[os.File]
	// nonblock: the epoll file description is non-blocking (for the
	// runtime's netpoller; epoll_wait itself ignores the flag).
	nonblock bool
}

// longAgo is the read deadline Wake sets to unpark WaitPark at once.
var longAgo = time.Unix(1, 0)

// Open creates a Poller.
func Open() (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("poll: epoll_create1: %w", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("poll: eventfd: %w", err)
	}
	p := &Poller{epfd: epfd, efd: efd}
	if err := p.ctl(unix.EPOLL_CTL_ADD, efd, In, wakeTag); err != nil {
		unix.Close(efd)
		unix.Close(epfd)
		return nil, err
	}
	return p, nil
}

// pollable registers the epoll descriptor with the runtime's netpoller on
// first use of WaitPark: an epoll descriptor is itself pollable (readable
// while it has events), and os.NewFile registers a non-blocking one.
func (p *Poller) pollable() error {
	if p.file != nil {
		return nil
	}
	if err := p.setNonblock(); err != nil {
		return err
	}
	f := os.NewFile(uintptr(p.epfd), "epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		// Not registered: leave the descriptor to Close.
		return fmt.Errorf("poll: %w", err)
	}
	p.file, p.rc = f, rc
	p.tryFn = p.try
	p.park.Store(f)
	return nil
}

// setNonblock makes the epoll file description non-blocking, once (its
// duplicates share the flag).
func (p *Poller) setNonblock() error {
	if p.nonblock {
		return nil
	}
	if err := unix.SetNonblock(p.epfd, true); err != nil {
		return fmt.Errorf("poll: set epoll non-blocking: %w", err)
	}
	p.nonblock = true
	return nil
}

func (p *Poller) ctl(op, fd int, events uint32, tag uint64) error {
	ev := unix.EpollEvent{Events: events}
	setTag(&ev, tag)
	if err := unix.EpollCtl(p.epfd, op, fd, &ev); err != nil {
		return fmt.Errorf("poll: epoll_ctl(%d, fd %d): %w", op, fd, err)
	}
	return nil
}

// Add registers fd for events (a mask of In, Out, RDHup, ET...); Wait
// reports its readiness with tag. Tag ^uint64(0) is reserved.
func (p *Poller) Add(fd int, events uint32, tag uint64) error {
	return p.ctl(unix.EPOLL_CTL_ADD, fd, events, tag)
}

// Modify changes fd's registered events and tag.
func (p *Poller) Modify(fd int, events uint32, tag uint64) error {
	return p.ctl(unix.EPOLL_CTL_MOD, fd, events, tag)
}

// Delete removes fd's registration. Closing the last descriptor of a file
// removes it too, so Delete is needed only for descriptors that stay open.
func (p *Poller) Delete(fd int) error {
	return p.ctl(unix.EPOLL_CTL_DEL, fd, 0, 0)
}

// Wait blocks until at least one registered descriptor is ready, a Wake
// arrives, or timeout passes (a negative timeout waits forever, zero only
// polls). It fills events and returns how many it filled, and whether a
// wake-up was consumed. After a wake-up the caller must look at whatever
// the waker queued for it: the pending flag is cleared before Wait returns,
// so a Wake that races with the caller's look writes the eventfd again.
func (p *Poller) Wait(events []Event, timeout time.Duration) (n int, woken bool, err error) {
	if err := p.sizeRaw(events); err != nil {
		return 0, false, err
	}
	raw := p.raw
	msec := -1
	if timeout >= 0 {
		// Round up so that a sub-millisecond timeout does not busy-poll.
		msec = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	var got int
	for {
		got, err = unix.EpollWait(p.epfd, raw, msec)
		if err == unix.EINTR {
			if msec > 0 {
				// Rare; treat as a timeout rather than recompute the deadline.
				return 0, false, nil
			}
			continue
		}
		if err != nil {
			if p.closed.Load() {
				return 0, false, ErrClosed
			}
			return 0, false, fmt.Errorf("poll: epoll_wait: %w", err)
		}
		break
	}
	n, woken = p.collect(events, got)
	return n, woken, nil
}

// sizeRaw makes p.raw the length of events, the most one wait returns.
func (p *Poller) sizeRaw(events []Event) error {
	if len(events) == 0 {
		return errors.New("poll: Wait needs room for at least one event")
	}
	if cap(p.raw) < len(events) {
		p.raw = make([]unix.EpollEvent, len(events))
	}
	p.raw = p.raw[:len(events)]
	return nil
}

// collect copies got raw events into events, consuming the wake-up.
func (p *Poller) collect(events []Event, got int) (n int, woken bool) {
	for i := range got {
		tag := getTag(&p.raw[i])
		if tag == wakeTag {
			var buf [8]byte
			_, _ = unix.Read(p.efd, buf[:])
			p.pending.Store(0)
			woken = true
			continue
		}
		events[n] = Event{Events: p.raw[i].Events, Tag: tag}
		n++
	}
	return n, woken
}

// WaitPark is Wait for a goroutine that does not own its thread: instead
// of blocking the thread in epoll_wait it parks the goroutine in the
// runtime's netpoller until the epoll instance has events, so the Go
// scheduler wakes it like any goroutine blocked on a socket. Same contract
// as Wait.
func (p *Poller) WaitPark(events []Event, timeout time.Duration) (n int, woken bool, err error) {
	if err := p.sizeRaw(events); err != nil {
		return 0, false, err
	}
	if err := p.pollable(); err != nil {
		return 0, false, err
	}
	// From here on Wake goes through the runtime; a Wake that still wrote
	// the eventfd set pending first, which the check below sees.
	p.parkWake.Store(true)
	if timeout == 0 {
		p.try(uintptr(p.epfd))
		if p.tryErr != nil {
			return 0, false, p.waitErr(p.tryErr)
		}
		n, woken = p.collect(events, p.tryN)
		return n, p.consumeWake() || woken, nil
	}
	// The deadline is set on every wait: a Wake may have left one in the
	// past. A Wake that came before it is seen in pending; one after it
	// sets its own deadline, which unparks the read below.
	if timeout > 0 {
		_ = p.file.SetReadDeadline(time.Now().Add(timeout))
	} else {
		_ = p.file.SetReadDeadline(time.Time{})
	}
	if p.pending.Load() != 0 {
		p.try(uintptr(p.epfd))
		if p.tryErr != nil {
			return 0, false, p.waitErr(p.tryErr)
		}
		n, woken = p.collect(events, p.tryN)
		return n, p.consumeWake() || woken, nil
	}
	p.tryN, p.tryErr = 0, nil
	err = p.rc.Read(p.tryFn)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, p.consumeWake(), nil
		}
		return 0, false, p.waitErr(err)
	}
	if p.tryErr != nil {
		return 0, false, p.waitErr(p.tryErr)
	}
	n, woken = p.collect(events, p.tryN)
	return n, p.consumeWake() || woken, nil
}

// WaitParkOnce is WaitPark for a goroutine that otherwise blocks in Wait
// (an event loop that blocks while it has work and parks while it has
// none): it parks on a duplicate of the epoll descriptor registered with
// the runtime's netpoller for this wait only. Registered for good, as
// WaitPark's is, every event a later blocking Wait takes would also wake
// an idle runtime thread through the nested epoll, for nothing. A parked
// goroutine holds no P; one blocked in a system call keeps its P until the
// runtime's monitor takes it back (up to 10-20 ms), and while every P is
// held so, every other goroutine of the process waits. Same contract as
// Wait.
func (p *Poller) WaitParkOnce(events []Event, timeout time.Duration) (n int, woken bool, err error) {
	if err := p.sizeRaw(events); err != nil {
		return 0, false, err
	}
	if err := p.setNonblock(); err != nil {
		return 0, false, err
	}
	fd, err := unix.FcntlInt(uintptr(p.epfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0, false, p.waitErr(err)
	}
	f := os.NewFile(uintptr(fd), "epoll")
	defer func() {
		// Back to the eventfd for the next blocking wait. A Wake that read
		// parkWake before this store readied the park through the deadline
		// only (or found no file): its pending flag, set first, is taken
		// here so it is not lost.
		p.parkWake.Store(false)
		p.park.Store(nil)
		_ = f.Close()
		if p.pending.Swap(0) != 0 {
			woken = true
		}
	}()
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, false, fmt.Errorf("poll: %w", err)
	}
	p.park.Store(f)
	// From here on Wake goes through the runtime; a Wake that still wrote
	// the eventfd set pending first, which this check sees.
	p.parkWake.Store(true)
	if p.pending.Load() != 0 {
		timeout = 0
	}
	if timeout == 0 {
		p.try(uintptr(fd))
	} else {
		if timeout > 0 {
			_ = f.SetReadDeadline(time.Now().Add(timeout))
		}
		if p.tryFn == nil {
			p.tryFn = p.try
		}
		p.tryN, p.tryErr = 0, nil
		if err := rc.Read(p.tryFn); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return 0, false, nil
			}
			return 0, false, p.waitErr(err)
		}
	}
	if p.tryErr != nil {
		return 0, false, p.waitErr(p.tryErr)
	}
	n, woken = p.collect(events, p.tryN)
	return n, woken, nil
}

// consumeWake clears a wake-up that Wake delivered through the read
// deadline and reports whether there was one.
func (p *Poller) consumeWake() bool {
	return p.pending.Swap(0) != 0
}

// try polls without blocking (epoll_pwait with a zero timeout and no
// signal mask, a raw syscall since it cannot block); false asks the
// runtime to park until the epoll descriptor is readable. The poll cannot
// be skipped even when the last one emptied the ready list: the runtime
// clears the descriptor's readiness before calling try, so an event that
// came in between is seen only by polling.
func (p *Poller) try(fd uintptr) bool {
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, fd, uintptr(unsafe.Pointer(&p.raw[0])), uintptr(len(p.raw)), 0, 0, 0)
		switch errno {
		case 0:
			p.tryN, p.tryErr = int(n), nil
			return n > 0
		case unix.EINTR:
			continue
		}
		p.tryN, p.tryErr = 0, errno
		return true
	}
}

func (p *Poller) waitErr(err error) error {
	if p.closed.Load() {
		return ErrClosed
	}
	return fmt.Errorf("poll: epoll_wait: %w", err)
}

// Wake makes the owner's current or next Wait return with woken set. It is
// safe from any goroutine; while one wake-up is pending, further calls do
// nothing.
func (p *Poller) Wake() error {
	if !p.pending.CompareAndSwap(0, 1) {
		return nil
	}
	if p.parkWake.Load() {
		// Readies the parked owner directly (or makes its next park return
		// at once): no syscall, and no wait for the runtime's netpoll.
		if f := p.park.Load(); f != nil {
			if err := f.SetReadDeadline(longAgo); err != nil && p.closed.Load() {
				return ErrClosed
			}
		}
		return nil
	}
	one := [8]byte{1}
	for {
		_, err := unix.Write(p.efd, one[:])
		switch err {
		case nil, unix.EAGAIN:
			// EAGAIN: the counter is saturated, so a wake-up is pending anyway.
			return nil
		case unix.EINTR:
			continue
		}
		if p.closed.Load() {
			return ErrClosed
		}
		return fmt.Errorf("poll: eventfd write: %w", err)
	}
}

// Close releases the epoll instance and the eventfd. The owner must not be
// in Wait, and no Wake may run concurrently with or after Close: the
// descriptor numbers may already belong to something else.
func (p *Poller) Close() error {
	if p.closed.Swap(true) {
		return ErrClosed
	}
	err1 := unix.Close(p.efd)
	var err2 error
	if p.file != nil {
		err2 = p.file.Close()
	} else {
		err2 = unix.Close(p.epfd)
	}
	return errors.Join(err1, err2)
}

// setTag stores tag in the event's 64-bit data union, which x/sys/unix
// spells as the Fd and Pad fields; the kernel hands the 8 bytes back as they
// were, so the split does not depend on byte order.
func setTag(ev *unix.EpollEvent, tag uint64) {
	ev.Fd = int32(uint32(tag))
	ev.Pad = int32(uint32(tag >> 32))
}

func getTag(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}
