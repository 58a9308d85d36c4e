package engine

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel/engine/poll"
	"golang.org/x/sys/unix"
)

// epollBackend runs relays in epoll event loops: Config.Loops loops for
// TCP⇄TCP relays and as many again for TCP⇄stream relays.
//
// Each loop is one goroutine that owns its poller, its relays and its pipe
// pool; nothing it owns is touched by another goroutine. The two kinds of
// loop wait differently, by measurement (2-core lab, A/B against the
// other way round):
//   - a TCP⇄TCP loop blocks its goroutine in epoll_wait (a plain blocking
//     syscall, the thread not locked): the kernel wakes that very thread
//     when a socket turns ready, which costs less than going through the
//     runtime's netpoller (round trips ×1.3, CPU per round trip ×0.6).
//     With no relay (lingering before it ends) it parks instead
//     (poll.Poller.WaitParkOnce): a thread blocked in a system call keeps
//     its P until the runtime's monitor takes it back, 10-20 ms at worst,
//     and with every P held so by lingering loops the rest of the daemon
//     (the ZDS and xDS clients, handshakes) waited that long to run;
//   - a TCP⇄stream loop parks in the runtime's netpoller (on the epoll
//     descriptor itself): it is woken mostly by HBONE reader goroutines
//     through its eventfd, and a goroutine handing work to a parked
//     goroutine stays in the scheduler, where a thread returning from a
//     blocking syscall would first have to win a P back (blocking lost a
//     quarter of HBONE throughput then). With Config.BlockStreamLoops (the
//     daemon's: its HBONE connections are loop-owned, so their own sockets
//     wake the loop) it waits as a TCP⇄TCP loop.
//
// With Config.LockOSThread every loop owns an OS thread and blocks it in
// epoll_wait. Other goroutines reach a loop only through its task queue (a
// mutex-guarded slice plus the poller's coalescing eventfd wake-up, which
// ends a blocked epoll_wait as well as a park).
// Relays are assigned round-robin, within their kind, when handed over
// and stay on their loop.
//
// Sockets are registered once, edge-triggered for both directions
// (EPOLLIN|EPOLLOUT|EPOLLRDHUP|EPOLLET): the loop keeps each socket's
// readiness in the relay and clears it only when a splice says EAGAIN, so a
// relay costs no epoll_ctl after its registration.
//
// A loop starts with its first relay and parks (its goroutine ends) after
// Config.Linger with none, so an unused engine holds no thread (a blocked
// loop holds one while it lingers) and tests see no leaked goroutine.
type epollBackend struct {
	e     *Engine
	loops []*eloop // all loops: tcp, then stream
	tcp   []*eloop // TCP⇄TCP relays, blocking in epoll_wait
	strm  []*eloop // TCP⇄stream relays, parking in the netpoller
	loopGroup
}

func newEpollBackend(e *Engine) (backend, error) {
	b := &epollBackend{e: e}
	for i := range 2 * e.cfg.Loops {
		p, err := poll.Open()
		if err != nil {
			for _, l := range b.loops {
				l.p.Close()
			}
			return nil, fmt.Errorf("engine: epoll: %w", err)
		}
		b.loops = append(b.loops, &eloop{
			b:        b,
			p:        p,
			blocking: i < e.cfg.Loops || e.cfg.BlockStreamLoops,
			loopCore: newLoopCore[task, loopRelay, *relayBase](&e.cfg),
			events:   make([]poll.Event, 256),
		})
	}
	b.tcp, b.strm = b.loops[:e.cfg.Loops], b.loops[e.cfg.Loops:]
	return b, nil
}

func (b *epollBackend) relayTCP(fa, fb int, s *session) { b.handTCP(fa, fb, s, nil) }

func (b *epollBackend) relayDial(fa, fb int, dst netip.AddrPort, timeout time.Duration, s *session) {
	b.handTCP(fa, fb, s, &dialing{dst: dst, timeout: timeout})
}

// handTCP hands a TCP⇄TCP relay to a loop; d is set when B is connecting.
func (b *epollBackend) handTCP(fa, fb int, s *session, d *dialing) {
	l := b.tcp[b.pick(len(b.tcp))]
	// Both sockets start out writable: their send buffers are empty at the
	// handoff, and a send that finds one full says EAGAIN. Waiting for the
	// registration's EPOLLOUT instead would park the first bytes read
	// before it in a pipe. A connecting B turns writable when its connect
	// completes.
	r := &tcpRelay{l: l, s: s, fd: [2]int{fa, fb}, wr: [2]bool{true, d == nil}, connecting: d != nil}
	r.init(r)
	r.dir[0].count, r.dir[1].count = &s.counters.AToB, &s.counters.BToA
	if d != nil {
		d.r = r
	}
	handed(l.submit(task{op: opAdd, r: r, dial: d}), fa, fb, s, r)
}

func (b *epollBackend) close() { stopLoops(&b.loopGroup, b.loops) }

func (b *epollBackend) stats(st *Stats) {
	st.Loops = len(b.tcp)
	st.StreamLoops = len(b.strm)
	for _, l := range b.loops {
		l.coreStats(st)
		st.StreamBuffers += int(l.nBufs.Load())
		st.DirectWrites += l.nDirect.Load()
		st.Conns += int(l.nConns.Load())
		st.ConnStalls += l.nStalls.Load()
		st.LocalWakes += l.nLocalWakes.Load()
	}
}

type taskOp uint8

const (
	opAdd       taskOp = iota // register a new relay
	opAbort                   // abort a relay with err
	opWake                    // a stream relay's stream may progress
	opStop                    // abort everything and end the loop
	opConnAdd                 // register a loop-owned connection (conn_linux.go)
	opConnWake                // a loop-owned connection owes a Flush
	opConnClose               // close a loop-owned connection (err: ErrAborted to reset)
)

// task is work handed to a loop by another goroutine.
type task struct {
	op   taskOp
	r    loopRelay
	err  error
	dial *dialing // opAdd of a relay whose B side is connecting
}

// dialing is a relay whose B socket is connecting, in its loop's list
// until the connect completes, fails or times out.
type dialing struct {
	r        *tcpRelay
	dst      netip.AddrPort
	timeout  time.Duration // from the handoff
	deadline time.Duration // loop time, set when the loop adds the relay
}

// loopRelay is what an epoll loop's slots hold: a relay, TCP⇄TCP
// (tcpRelay) or TCP⇄stream (streamRelay), or a loop-owned connection
// (connEntry).
type loopRelay interface {
	base() *relayBase
	// fdOf returns the socket of side (0 A, 1 B), -1 for a stream side.
	fdOf(side int) int
	// event records readiness of side's socket and services the relay.
	event(side int, ev poll.Event)
	// service moves what the readiness allows.
	service()
	// end closes the relay (resetting its peers if abort) and reports err.
	end(err error, abort bool)
	// refuse ends a relay that never ran (the loop stopped first).
	refuse(err error)
}

// relayBase is the loop's bookkeeping common to every loopRelay.
type relayBase struct {
	self   loopRelay
	slot   int32
	queued bool // in l.ready
	closed bool

	idleLinks[*relayBase] // l.idle
}

func (b *relayBase) init(self loopRelay) {
	b.self = self
	b.slot = -1
}

func (b *relayBase) base() *relayBase { return b }

func (b *relayBase) links() *idleLinks[*relayBase] { return &b.idleLinks }

// eloop is one epoll event loop.
type eloop struct {
	b *epollBackend
	p *poll.Poller
	// blocking: wait in epoll_wait, not parked in the netpoller.
	blocking bool
	iov      [][]byte // scratch for stream relays' writev (epoll_stream_linux.go)
	scratch  []byte   // TCP relays' copy buffer (epoll_tcp_linux.go)

	// The task queue, the slots (by the slot half of an event tag), the
	// idle list, the clock and the pipes.
	loopCore[task, loopRelay, *relayBase]

	// Owned by the loop goroutine.
	ready      []loopRelay // relays that stopped on their budget, not on EAGAIN
	spareReady []loopRelay
	dialing    []*dialing // relays whose B side is connecting
	events     []poll.Event

	// Loop-owned connections (conn_linux.go), owned by the loop goroutine.
	flush      []*connEntry // to Flush at the end of the iteration
	spareFlush []*connEntry // flush's other half
	closing    []*connEntry // flushing or lingering, by deadline

	// Mirrors for Stats, written by the loop.
	nBufs   atomic.Int32 // buffers held by stream relays, for Stats
	nDirect atomic.Int64 // writes stream relays' TryDeliver made, for Stats
	// TryDeliver's writes the socket did not take whole (tests)
	nDirectShort atomic.Int64
	nConns       atomic.Int32 // loop-owned connections, for Stats
	nStalls      atomic.Int64 // driver calls over connStall, for Stats
	nLocalWakes  atomic.Int64 // WakeLocal readying a relay directly, for Stats
	nWakeups     atomic.Int64 // Poller.Wake calls (tests: what awake saves)
	nWaits       atomic.Int64 // waits that returned (tests: an idle loop sleeps)
}

// submit queues t for the loop, starting the loop if it is parked; false
// means the engine is closing.
func (l *eloop) submit(t task) bool { return l.q.submit(t, l.start, l.wake) }

// start starts the loop goroutine (under l.q's lock).
func (l *eloop) start() { l.b.launch(l.run) }

func (l *eloop) shutdown() { l.q.shutdown(task{op: opStop}, l.wake) }

func (l *eloop) closeLoop() {
	l.closePipes()
	l.p.Close()
}

// wake ends the loop's wait (under l.q's lock, so the wake-up cannot reach
// a poller that close has already released).
func (l *eloop) wake() {
	l.nWakeups.Add(1)
	_ = l.p.Wake()
}

func (l *eloop) run() {
	wait := l.p.WaitPark
	blocks := l.blocking
	if l.b.e.cfg.LockOSThread {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		blocks = true
	}
	switch {
	case l.b.e.cfg.LockOSThread:
		wait = l.p.Wait
	case blocks:
		wait = func(ev []poll.Event, timeout time.Duration) (int, bool, error) {
			if l.slots.live == 0 && timeout != 0 {
				// Nothing to relay: linger parked, holding no P.
				return l.p.WaitParkOnce(ev, timeout)
			}
			return l.p.Wait(ev, timeout)
		}
	}
	l.loopClock.start()
	l.q.awake.Store(true)
	if l.drainTasks() {
		return
	}
	for {
		timeout := l.timeout()
		// The queue is looked at once more before a wait that may block
		// (submitters skip the wake-up while the loop is awake); tasks
		// that came meanwhile make it a poll.
		if timeout != 0 && !l.q.sleep() {
			timeout = 0
		}
		if blocks && l.yieldDue() {
			runtime.Gosched()
		}
		n, woken, err := wait(l.events, timeout)
		l.nWaits.Add(1)
		l.q.awake.Store(true)
		l.tick()
		if err != nil {
			// The poller is broken; nothing more can run here.
			l.b.e.logf("engine: loop stopped: %v", err)
			l.stop(err)
			return
		}
		for i := range n {
			l.handle(l.events[i])
		}
		l.runReady()
		if l.drainTasks() {
			return
		}
		l.expireIdle()
		l.expireDials()
		l.expireConns()
		// Last: every commit of the iteration (the driver's own, its
		// relays') leaves in one Flush per connection.
		l.flushConns()
		if len(l.ready) == 0 && n == 0 && !woken && l.lingeredEmpty() {
			if l.q.park() {
				return
			}
		}
	}
}

// timeout is how long the next Wait may block.
func (l *eloop) timeout() time.Duration {
	t := l.relayTimeout()
	for _, d := range l.dialing {
		left := max(d.deadline-l.now, 0)
		if t < 0 || left < t {
			t = left
		}
	}
	return t
}

// relayTimeout is how long the next Wait may block for the relays' sake
// (the idle timeout, the linger), -1 for ever.
func (l *eloop) relayTimeout() time.Duration {
	if len(l.ready) > 0 {
		return 0
	}
	return l.connWait(l.relayWait())
}

// drainTasks runs the queued tasks; true means the loop has stopped.
func (l *eloop) drainTasks() bool {
	batch := l.q.take()
	stop := false
	for i, t := range batch {
		switch t.op {
		case opAdd:
			if t.dial != nil {
				t.dial.deadline = l.now + t.dial.timeout
				l.dialing = append(l.dialing, t.dial)
			}
			l.add(t.r)
		case opAbort:
			if !t.r.base().closed {
				t.r.end(t.err, true)
			}
		case opWake:
			t.r.(*streamRelay).woken()
		case opConnAdd:
			l.addConn(t.r.(*connEntry))
		case opConnWake:
			l.markFlush(t.r.(*connEntry))
		case opConnClose:
			t.r.(*connEntry).close(t.err)
		case opStop:
			stop = true
		}
		batch[i] = task{}
	}
	if stop {
		l.stop(ErrClosed)
	}
	return stop
}

// stop aborts every relay and ends the loop.
func (l *eloop) stop(err error) {
	for _, r := range l.slots.slots {
		switch r := r.(type) {
		case nil:
		case *connEntry:
			// No reset: the driver may write a last alert in Ended.
			r.finish(err, false)
		default:
			r.end(err, true)
		}
	}
	l.ready = l.ready[:0]
	clear(l.flush)
	l.flush = l.flush[:0]
	// Relays queued after the stop would never run: refuse them.
	for _, t := range l.q.stop(true) {
		if t.op == opAdd || t.op == opConnAdd {
			t.r.refuse(err)
		}
	}
}

func (l *eloop) add(r loopRelay) {
	b := r.base()
	slot := l.place(r, b)
	b.slot = slot
	const interest = poll.In | poll.Out | poll.RDHup | poll.ET
	for side := range 2 {
		fd := r.fdOf(side)
		if fd < 0 {
			continue
		}
		if err := l.p.Add(fd, interest, uint64(slot)<<1|uint64(side)); err != nil {
			r.end(err, true)
			return
		}
	}
	if sr, ok := r.(*streamRelay); ok {
		// The stream may hold data from before the handover; its wake-ups
		// until now were ignored.
		sr.service()
	}
}

// release forgets a relay that has ended.
func (l *eloop) release(r *relayBase) { l.forget(r.slot, r) }

func (l *eloop) handle(ev poll.Event) {
	r := l.slots.get(int32(ev.Tag >> 1))
	if r == nil {
		return // ended earlier in this batch
	}
	r.event(int(ev.Tag&1), ev)
}

// event records the readiness of side's socket and services the relay.
func (r *tcpRelay) event(side int, ev poll.Event) {
	if r.connecting && side == 1 {
		if !r.connected(ev) {
			return
		}
	}
	if ev.Events&poll.Err != 0 {
		// A reset (or another hard error) ends the relay now, even when no
		// byte is waiting to be moved on that side: RST travels on.
		if err := sockError(r.fd[side]); err != nil {
			r.end(r.opErr("connection", side, err), true)
			return
		}
	}
	if ev.Events&(poll.In|poll.RDHup|poll.Hup|poll.Err) != 0 {
		r.rd[side] = true
	}
	if ev.Events&(poll.RDHup|poll.Hup|poll.Err) != 0 {
		r.hup[side] = true
	}
	if ev.Events&(poll.Out|poll.Hup|poll.Err) != 0 {
		r.wr[side] = true
	}
	if r.connecting {
		// A's readiness is kept for when B is connected.
		return
	}
	r.service()
}

// connected handles an event of a connecting B socket: false means the
// connect has not completed yet, or failed (the relay then ended).
func (r *tcpRelay) connected(ev poll.Event) bool {
	// A connecting socket reports nothing until the handshake ends: then
	// EPOLLOUT, or EPOLLERR with the reason in SO_ERROR.
	if ev.Events&(poll.Err|poll.Hup) != 0 {
		err := sockError(r.fd[1])
		if err == nil {
			err = unix.ECONNREFUSED
		}
		d := r.l.dialDone(r)
		r.connecting = false
		r.end(dialError(d.dst, err), true)
		return false
	}
	if ev.Events&poll.Out == 0 {
		return false
	}
	r.l.dialDone(r)
	r.connecting = false
	return true
}

// runReady gives another turn to relays that used up their budget.
func (l *eloop) runReady() {
	if len(l.ready) == 0 {
		return
	}
	batch := l.ready
	l.ready = l.spareReady[:0]
	for i, r := range batch {
		r.base().queued = false
		r.service()
		batch[i] = nil
	}
	l.spareReady = batch[:0]
}

// expireIdle ends the relays idle for the idle timeout (ending takes a
// relay off the idle list).
func (l *eloop) expireIdle() {
	l.expire(func(r *relayBase) {
		if sr, ok := r.self.(*streamRelay); ok && sr.directSinceTouch() {
			// Bytes went straight to its socket (TryDeliver) since its
			// last move on the loop: it was active.
			l.touch(r)
			return
		}
		r.self.end(ErrIdleTimeout, true)
	})
}

// scratchBuf returns the loop's copy buffer, made on first use: one per
// loop, shared by its relays, since a relay parks what it cannot send.
func (l *eloop) scratchBuf() []byte {
	if l.scratch == nil {
		l.scratch = make([]byte, scratchSize)
	}
	return l.scratch
}

// expireDials ends the relays whose connect has outlasted its timeout.
func (l *eloop) expireDials() {
	for i := 0; i < len(l.dialing); {
		d := l.dialing[i]
		if l.now < d.deadline {
			i++
			continue
		}
		// end removes d from the list.
		d.r.end(dialError(d.dst, os.ErrDeadlineExceeded), true)
	}
}

// dialDone removes r from the connecting relays and returns its entry.
func (l *eloop) dialDone(r *tcpRelay) *dialing {
	for i, d := range l.dialing {
		if d.r == r {
			last := len(l.dialing) - 1
			l.dialing[i] = l.dialing[last]
			l.dialing[last] = nil
			l.dialing = l.dialing[:last]
			return d
		}
	}
	return nil
}
