package engine

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel/engine/uring"
	"golang.org/x/sys/unix"
)

// uringBackend runs TCP⇄TCP relays in io_uring event loops, one per core.
//
// Each loop owns a ring set up with SingleIssuer and DeferTaskrun on a
// locked OS thread (the kernel requires one submitting thread, and runs
// completion work only when that thread asks for completions), its relays
// and its pipe pool. Other goroutines reach it through a task queue and an
// eventfd on which the ring keeps a read armed: one write wakes the loop,
// and at most one wake-up is pending at a time.
//
// A relay keeps a multishot POLLIN armed on each socket and moves bytes
// with a pair of splices, socket→pipe hard-linked to pipe→socket, submitted
// only once the poll has said the socket is readable: the kernel runs every
// splice in an io-wq worker, and a splice from an empty socket would park
// that worker until data came. So 10,000 idle relays hold 20,000 armed
// polls and no worker. A POLLOUT is armed (one-shot) only when a
// destination is full. Ending a relay cancels its requests (by descriptor)
// before closing, and its slot, pipes and result wait for the last
// completion.
//
// A loop creates its ring when it starts and closes it when it parks after
// Config.Linger with no relay, so an unused engine holds no thread or ring.
type uringBackend struct {
	e     *Engine
	loops []*uloop
	loopGroup
}

// uringSetupFlags are the ring flags the loops use.
const uringSetupFlags = uring.SetupSingleIssuer | uring.SetupDeferTaskrun | uring.SetupSubmitAll

// probeUring says whether this kernel lets the loops run: it sets up a ring
// the way they do and probes the operations they submit.
func probeUring() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := uring.New(uring.Config{Entries: 8, Flags: uringSetupFlags})
	if err != nil {
		return fmt.Errorf("engine: io_uring: %w", err)
	}
	defer r.Close()
	if r.Features()&uring.FeatExtArg == 0 || r.Features()&uring.FeatNoDrop == 0 {
		return errors.New("engine: io_uring: kernel lacks EXT_ARG or NODROP")
	}
	p, err := r.Probe()
	if err != nil {
		return fmt.Errorf("engine: io_uring: %w", err)
	}
	for _, op := range []uint8{uring.OpPollAdd, uring.OpSplice, uring.OpRead, uring.OpAsyncCancel} {
		if !p.Supported(op) {
			return fmt.Errorf("engine: io_uring: kernel lacks op %d", op)
		}
	}
	return nil
}

func newUringBackend(e *Engine) (backend, error) {
	if err := probeUring(); err != nil {
		return nil, err
	}
	b := &uringBackend{e: e}
	for range e.cfg.Loops {
		// Blocking, so the ring arms a poll for the armed read rather than
		// failing it with EAGAIN.
		efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			for _, l := range b.loops {
				unix.Close(l.efd)
			}
			return nil, fmt.Errorf("engine: eventfd: %w", err)
		}
		b.loops = append(b.loops, &uloop{
			b:        b,
			efd:      efd,
			wakeBuf:  make([]byte, 8),
			loopCore: newLoopCore[utask, *uRelay, *uRelay](&e.cfg),
			cqes:     make([]uring.CQE, 512),
		})
	}
	return b, nil
}

func (b *uringBackend) relayTCP(fa, fb int, s *session) {
	l := b.loops[b.pick(len(b.loops))]
	r := &uRelay{l: l, s: s, fd: [2]int{fa, fb}, slot: -1}
	r.dir[0].count, r.dir[1].count = &s.counters.AToB, &s.counters.BToA
	handed(l.submit(utask{op: opAdd, r: r}), fa, fb, s, r)
}

func (b *uringBackend) close() { stopLoops(&b.loopGroup, b.loops) }

func (b *uringBackend) stats(st *Stats) {
	st.Loops = len(b.loops)
	for _, l := range b.loops {
		l.coreStats(st)
	}
}

// utask is work handed to a uring loop by another goroutine.
type utask struct {
	op  taskOp
	r   *uRelay
	err error
}

// Completion kinds, in the low byte of an SQE's user data; the slot and a
// generation fill the rest so a completion finds its relay.
const (
	kWake uint8 = iota + 1
	kCancel
	kPollIn  // + side
	kPollIn1 //
	kPollOut // + side
	kPollOut1
	kSpliceIn // + direction
	kSpliceIn1
	kSpliceOut // + direction
	kSpliceOut1
)

func userData(kind uint8, slot int32, gen uint32) uint64 {
	return uint64(kind) | uint64(uint32(slot))<<8 | uint64(gen&0xffffff)<<40
}

// uloop is one io_uring event loop.
type uloop struct {
	b       *uringBackend
	efd     int
	pending atomic.Uint32 // a wake-up is written and not yet consumed

	// The task queue, the slots (by the slot in a completion's user data),
	// the idle list, the clock and the pipes.
	loopCore[utask, *uRelay, *uRelay]

	// Owned by the loop goroutine.
	ring     *uring.Ring
	wakeBuf  []byte
	woken    bool
	stopping bool
	gens     []uint32 // by slot: a completion for a slot's earlier relay is stale
	cqes     []uring.CQE
}

func (l *uloop) submit(t utask) bool { return l.q.submit(t, l.start, l.wakeLocked) }

// start starts the loop goroutine (under l.q's lock).
func (l *uloop) start() { l.b.launch(l.run) }

func (l *uloop) shutdown() { l.q.shutdown(utask{op: opStop}, l.wakeLocked) }

func (l *uloop) closeLoop() {
	l.closePipes()
	unix.Close(l.efd)
}

// wakeLocked writes the eventfd unless a wake-up is already pending; under
// l.q's lock so it never races with close releasing the eventfd.
func (l *uloop) wakeLocked() {
	if l.pending.CompareAndSwap(0, 1) {
		one := [8]byte{1}
		_, _ = unix.Write(l.efd, one[:])
	}
}

func (l *uloop) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l.loopClock.start()
	ring, err := uring.New(uring.Config{Entries: 1024, CQEntries: 8192, Flags: uringSetupFlags})
	if err != nil {
		l.b.e.logf("engine: io_uring loop cannot start: %v", err)
		l.fail(err)
		return
	}
	l.ring = ring
	// Close this run's own ring: once park or finishStop has released the
	// loop, a new run may already have installed its ring in l.ring.
	defer ring.Close()
	l.armWake()
	l.drainTasks()
	for {
		if _, err := l.ring.SubmitAndWait(1, l.timeout()); err != nil && err != unix.EBUSY && err != unix.EAGAIN {
			l.b.e.logf("engine: io_uring loop stopped: %v", err)
			l.stopping = true
		}
		l.tick()
		for {
			n := l.ring.Reap(l.cqes)
			for i := range n {
				l.handle(&l.cqes[i])
			}
			if n < len(l.cqes) {
				break
			}
		}
		if l.woken {
			l.woken = false
			l.drainTasks()
			l.armWake()
		}
		l.expireIdle()
		if l.stopping && l.slots.live == 0 {
			l.finishStop()
			return
		}
		if !l.stopping && l.lingeredEmpty() && l.q.park() {
			return
		}
	}
}

// fail refuses everything queued when the loop cannot run at all.
func (l *uloop) fail(err error) { l.refuseQueued(false, fmt.Errorf("engine: io_uring loop: %w", err)) }

// refuseQueued ends the loop's run and refuses the relays still queued;
// closing also refuses every later one.
func (l *uloop) refuseQueued(closing bool, err error) {
	for _, t := range l.q.stop(closing) {
		if t.op == opAdd {
			t.r.refuse(err)
		}
	}
}

func (l *uloop) timeout() time.Duration {
	if l.stopping {
		return 10 * time.Millisecond
	}
	return l.relayWait()
}

// finishStop ends the loop after a stop, refusing late tasks.
func (l *uloop) finishStop() { l.refuseQueued(true, ErrClosed) }

// sqe returns a free submission entry, submitting what is queued when the
// queue is full.
func (l *uloop) sqe() *uring.SQE {
	for {
		if s := l.ring.GetSQE(); s != nil {
			return s
		}
		if _, err := l.ring.Submit(); err != nil && err != unix.EBUSY && err != unix.EAGAIN {
			panic(fmt.Sprintf("engine: io_uring submit: %v", err))
		}
	}
}

func (l *uloop) armWake() {
	l.sqe().PrepRead(l.efd, l.wakeBuf, userData(kWake, 0, 0))
}

func (l *uloop) drainTasks() {
	batch := l.q.take()
	for i, t := range batch {
		switch t.op {
		case opAdd:
			if l.stopping {
				t.r.refuse(ErrClosed)
			} else {
				l.add(t.r)
			}
		case opAbort:
			t.r.end(t.err, true)
		case opStop:
			l.stopping = true
			for _, r := range l.slots.slots {
				if r != nil {
					r.end(ErrClosed, true)
				}
			}
		}
		batch[i] = utask{}
	}
}

func (l *uloop) add(r *uRelay) {
	slot := l.place(r, r)
	if int(slot) == len(l.gens) {
		l.gens = append(l.gens, 0)
	}
	l.gens[slot]++
	r.slot, r.gen = slot, l.gens[slot]
	// Sockets start writable; a full one says so with EAGAIN.
	r.wr = [2]bool{true, true}
	r.armIn(0)
	r.armIn(1)
}

func (l *uloop) handle(c *uring.CQE) {
	kind := uint8(c.UserData)
	if kind == kWake {
		l.pending.Store(0)
		l.woken = true
		return
	}
	if kind == kCancel {
		return
	}
	slot := int32(uint32(c.UserData >> 8))
	gen := uint32(c.UserData>>40) & 0xffffff
	r := l.slots.get(slot)
	if r == nil || r.gen&0xffffff != gen {
		return
	}
	r.complete(kind, c)
}

// release forgets a relay whose last request has completed.
func (l *uloop) release(r *uRelay) { l.forget(r.slot, r) }

// expireIdle ends the relays idle for the idle timeout.
func (l *uloop) expireIdle() {
	l.expire(func(r *uRelay) {
		r.l.idle.remove(r) // ending takes a while: keep it out of the scan
		r.end(ErrIdleTimeout, true)
	})
}
