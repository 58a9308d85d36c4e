package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel/engine/splice"
)

// The core both event-loop backends share (epoll_linux.go, uring_linux.go):
// the task queue other goroutines reach a loop through, the slot table its
// relays live in, the idle list the idle timeout scans, the loop's clock
// and its pipe pool with the figures Stats reads, gathered in loopCore; the
// backend's hold on its loops (loopGroup: spreading relays, stopping the
// loops) and the handing of a TCP pair (handed). What stays apart is how a
// loop waits (epoll_wait or a parked netpoller, io_uring completions) and
// what a relay is.

// taskQueue is how other goroutines hand work to a loop: a mutex-guarded
// slice plus the flags that say whether a goroutine runs the loop and
// whether the engine is closing. The loop goroutine takes the queued tasks
// in batches (take), reusing the slices.
type taskQueue[T any] struct {
	mu      sync.Mutex // guards tasks, running, closed
	tasks   []T
	running bool // a goroutine runs (or is about to run) the loop
	closed  bool // the engine is closing: refuse new tasks
	// awake: the loop is between two waits and will look at the queue
	// before its next one, so submit need not wake it (an eventfd write
	// in block mode, a deadline poke in park mode). Only loops that keep
	// it (epoll's) set it: cleared under mu by sleep, with the queue seen
	// empty, and set again by the loop when its wait returns; a submit
	// that races with the set wakes the loop spuriously, never too late.
	awake atomic.Bool

	spare []T // owned by the loop goroutine
}

// submit queues t. With the loop parked it marks it running and calls
// start (which starts the loop goroutine); otherwise it calls wake,
// unless the loop is awake (it drains the queue before it waits). Both
// run under the lock, so a wake-up cannot reach a loop that close has
// already released. False means the engine is closing.
func (q *taskQueue[T]) submit(t T, start, wake func()) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.tasks = append(q.tasks, t)
	if !q.running {
		q.running = true
		start()
		return true
	}
	if !q.awake.Load() {
		wake()
	}
	return true
}

// sleep is the loop's last look before a wait that may block: with no
// task queued it clears awake (from now on submitters wake the loop) and
// returns true; false means tasks are queued: do not block.
func (q *taskQueue[T]) sleep() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.tasks) > 0 {
		return false
	}
	q.awake.Store(false)
	return true
}

// shutdown refuses new tasks and, if the loop runs, queues stop and wakes
// it (under the lock, as submit).
func (q *taskQueue[T]) shutdown(stop T, wake func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	if q.running {
		q.tasks = append(q.tasks, stop)
		wake()
	}
}

// take returns the queued tasks; the loop clears each one it has run (so
// the slice holds no relay) and the slice is reused by the next take.
func (q *taskQueue[T]) take() []T {
	q.mu.Lock()
	q.tasks, q.spare = q.spare[:0], q.tasks
	q.mu.Unlock()
	return q.spare
}

// park ends the loop's run if no task arrived meanwhile.
func (q *taskQueue[T]) park() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.tasks) > 0 {
		return false
	}
	q.running = false
	return true
}

// stop ends the loop's run and returns the tasks still queued, for the
// loop to refuse; closing also refuses every later task.
func (q *taskQueue[T]) stop(closing bool) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	rest := q.tasks
	q.tasks = nil
	q.running = false
	if closing {
		q.closed = true
	}
	return rest
}

// isRunning reports whether a goroutine runs the loop, for Stats.
func (q *taskQueue[T]) isRunning() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running
}

// slotTable holds a loop's relays by slot, the number their events and
// completions carry; freed slots are reused.
type slotTable[R comparable] struct {
	slots []R
	free  []int32
	live  int
}

// put stores r in a free slot and returns it.
func (t *slotTable[R]) put(r R) int32 {
	t.live++
	if n := len(t.free); n > 0 {
		slot := t.free[n-1]
		t.free = t.free[:n-1]
		t.slots[slot] = r
		return slot
	}
	t.slots = append(t.slots, r)
	return int32(len(t.slots) - 1)
}

// get returns the relay in slot, the zero R for a free or unknown one.
func (t *slotTable[R]) get(slot int32) R {
	if slot < 0 || int(slot) >= len(t.slots) {
		var zero R
		return zero
	}
	return t.slots[slot]
}

// drop frees slot.
func (t *slotTable[R]) drop(slot int32) {
	var zero R
	t.slots[slot] = zero
	t.free = append(t.free, slot)
	t.live--
}

// idleNode is a relay on a loop's idle list: it carries its links.
type idleNode[N any] interface {
	comparable
	links() *idleLinks[N]
}

// idleLinks are a relay's place on its loop's idle list.
type idleLinks[N any] struct {
	lastActive time.Duration // loop time of the last byte moved
	prev, next N
}

// idleList is an intrusive doubly-linked list of relays, most recently
// active first: the idle timeout looks at the tail only. Loops keep it
// only with Config.IdleTimeout.
type idleList[N idleNode[N]] struct{ head, tail N }

func (q *idleList[N]) pushFront(r N) {
	var zero N
	l := r.links()
	l.prev, l.next = zero, q.head
	if q.head != zero {
		q.head.links().prev = r
	} else {
		q.tail = r
	}
	q.head = r
}

func (q *idleList[N]) remove(r N) {
	var zero N
	l := r.links()
	if l.prev != zero {
		l.prev.links().next = l.next
	} else if q.head == r {
		q.head = l.next
	}
	if l.next != zero {
		l.next.links().prev = l.prev
	} else if q.tail == r {
		q.tail = l.prev
	}
	l.prev, l.next = zero, zero
}

// touch marks r active at now, moving it to the front.
func (q *idleList[N]) touch(r N, now time.Duration) {
	l := r.links()
	if l.lastActive == now {
		return
	}
	l.lastActive = now
	q.remove(r)
	q.pushFront(r)
}

// blockingYieldEvery is how often an epoll loop that blocks its thread in
// epoll_wait passes through the scheduler. A
// goroutine that only runs and blocks in syscalls never does: its P's
// scheduling tick stays still, so the runtime's monitor (sysmon) takes it
// for a goroutine running for 10 ms (forcePreemptNS) and retakes its P
// while it sits in the syscall, and every retake resets sysmon to
// waking every 20 µs for the next millisecond or more. Under a steady
// round-trip load that was one sysmon nanosleep (and a task switch, 12-16
// µs on this machine kind) per 1-2 round trips, every 10 ms again
// (bench/results/2026-12-06-clients.md). A yield well inside 10 ms keeps the
// tick moving. Each yield may wake an idle thread (runtime.Gosched calls
// wakep), so it is kept rare: one per 4 ms costs far less than it saves.
// The io_uring loops do not yield: their daemons' HBONE path runs on
// goroutines (4.6-7 futex calls per round trip), whose own syscalls keep
// sysmon busy, and a yield measured no difference there.
const blockingYieldEvery = 4 * time.Millisecond

// loopClock is a loop's monotonic time, read once per wake-up, and since
// when it has had no relay (for Config.Linger) and it last yielded.
type loopClock struct {
	base       time.Time
	now        time.Duration // since base, at the last wake-up
	emptySince time.Duration
	lastYield  time.Duration // when yieldDue last said yes
	nYields    atomic.Int64  // yieldDue's yeses (tests)
}

// yieldDue reports whether a loop that blocks its thread in the kernel
// should yield (runtime.Gosched) before its next wait: once per
// blockingYieldEvery of loop time.
func (c *loopClock) yieldDue() bool {
	if c.now-c.lastYield < blockingYieldEvery {
		return false
	}
	c.lastYield = c.now
	c.nYields.Add(1)
	return true
}

// start begins a run of the loop (the clock's base survives parking).
func (c *loopClock) start() {
	if c.base.IsZero() {
		c.base = time.Now()
	}
	c.now = time.Since(c.base)
	c.emptySince = c.now
}

// tick reads the time after a wait.
func (c *loopClock) tick() { c.now = time.Since(c.base) }

// wait is how long a loop may block for its relays' sake: the rest of the
// linger with no relay, until the least recently active relay's idle
// timeout, or -1 for ever.
func (c *loopClock) wait(live int, linger, idleTimeout time.Duration, oldest *time.Duration) time.Duration {
	if live == 0 {
		return max(c.emptySince+linger-c.now, 0)
	}
	if idleTimeout > 0 && oldest != nil {
		return max(*oldest+idleTimeout-c.now, 0)
	}
	return -1
}

// lingered reports whether a loop with no relay has kept its thread for
// linger.
func (c *loopClock) lingered(linger time.Duration) bool { return c.now-c.emptySince >= linger }

// loopPipes is a loop's pipe pool and the mirrors of its load that Stats
// reads from other goroutines (written by the loop only).
type loopPipes struct {
	pipes                  *splice.Pool
	nRelays, nInUse, nFree atomic.Int32
}

func newLoopPipes(cfg Config) loopPipes {
	return loopPipes{pipes: splice.NewPool(splice.PoolConfig{PipeSize: cfg.PipeSize, MaxFree: cfg.MaxFreePipes})}
}

func (l *loopPipes) getPipe() (*splice.Pipe, error) {
	p, err := l.pipes.Get()
	if err != nil {
		return nil, err
	}
	l.mirror()
	return p, nil
}

// putPipe pools p, or closes it when it still holds bytes.
func (l *loopPipes) putPipe(p *splice.Pipe) {
	l.pipes.Put(p)
	l.mirror()
}

func (l *loopPipes) mirror() {
	l.nInUse.Store(int32(l.pipes.InUse()))
	l.nFree.Store(int32(l.pipes.Free()))
}

// closePipes releases the pool once the loop has stopped.
func (l *loopPipes) closePipes() {
	l.pipes.Close()
	l.nFree.Store(0)
}

// addStats adds the loop's figures to st.
func (l *loopPipes) addStats(st *Stats) {
	st.LoopRelays += int(l.nRelays.Load())
	st.PipesInUse += int(l.nInUse.Load())
	st.PipesFree += int(l.nFree.Load())
}

// refuseFDs ends a relay whose loop refused it or never ran it (the engine
// is closing, the loop stopped or could not start): both sockets are reset
// and the result carries err.
func refuseFDs(fa, fb int, s *session, err error) {
	abortFD(fa)
	abortFD(fb)
	s.finish(err)
}

// handed finishes handing a TCP pair to a loop: queued says the loop took
// the relay r; otherwise (the engine is closing) both sockets are reset.
// The owner is set after queueing, so an abort that came first reaches the
// loop after the relay itself.
func handed(queued bool, fa, fb int, s *session, r aborter) {
	if !queued {
		refuseFDs(fa, fb, s, ErrClosed)
		return
	}
	s.setOwner(r)
}

// loopGroup is a backend's hold on its loops' goroutines: the round-robin
// counter that spreads relays over the loops and the WaitGroup close waits
// on.
type loopGroup struct {
	next atomic.Uint32
	wg   sync.WaitGroup // running loop goroutines
}

// pick returns the index of the loop, among n, the next relay goes to.
func (g *loopGroup) pick(n int) int { return int(g.next.Add(1)) % n }

// launch runs one run of a loop on a goroutine of its own (called under
// the loop's task-queue lock, see taskQueue.submit).
func (g *loopGroup) launch(run func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		run()
	}()
}

// coreLoop is what stopLoops needs of a loop.
type coreLoop interface {
	// shutdown refuses new tasks and asks a running loop to stop.
	shutdown()
	// closeLoop releases what the loop keeps while parked (pipes, its
	// poller or eventfd), once its goroutine has ended.
	closeLoop()
}

// stopLoops stops every loop of g and releases them: the backends' close.
func stopLoops[L coreLoop](g *loopGroup, loops []L) {
	for _, l := range loops {
		l.shutdown()
	}
	g.wg.Wait()
	for _, l := range loops {
		l.closeLoop()
	}
}

// loopCore is the state both kinds of event loop keep the same way: T is
// the loop's task, R what its slots hold, N a relay's node on its idle
// list. Owned by the loop goroutine, but for q and the Stats mirrors.
type loopCore[T any, R comparable, N idleNode[N]] struct {
	cfg   *Config // the engine's
	q     taskQueue[T]
	slots slotTable[R] // by the slot number events and completions carry
	idle  idleList[N]  // least recently active last; only with IdleTimeout
	loopClock
	loopPipes
}

func newLoopCore[T any, R comparable, N idleNode[N]](cfg *Config) loopCore[T, R, N] {
	return loopCore[T, R, N]{cfg: cfg, loopPipes: newLoopPipes(*cfg)}
}

// place stores a new relay r, whose idle-list node is n, in a free slot
// and returns the slot.
func (c *loopCore[T, R, N]) place(r R, n N) int32 {
	slot := c.slots.put(r)
	c.nRelays.Add(1)
	if c.cfg.IdleTimeout > 0 {
		n.links().lastActive = c.now
		c.idle.pushFront(n)
	}
	return slot
}

// forget frees the slot of a relay that has ended and takes its node n off
// the idle list.
func (c *loopCore[T, R, N]) forget(slot int32, n N) {
	c.slots.drop(slot)
	c.nRelays.Add(-1)
	if c.cfg.IdleTimeout > 0 {
		c.idle.remove(n)
	}
	if c.slots.live == 0 {
		c.emptySince = c.now
	}
}

// touch marks n active for the idle timeout.
func (c *loopCore[T, R, N]) touch(n N) {
	if c.cfg.IdleTimeout > 0 {
		c.idle.touch(n, c.now)
	}
}

// expire calls end for each relay idle for the idle timeout, least
// recently active first; end takes the relay off the idle list's tail
// (ending it, or marking it active when it moved bytes the loop did not
// see).
func (c *loopCore[T, R, N]) expire(end func(N)) {
	it := c.cfg.IdleTimeout
	if it <= 0 {
		return
	}
	var none N
	for r := c.idle.tail; r != none && c.now-r.links().lastActive >= it; r = c.idle.tail {
		end(r)
	}
}

// relayWait is how long the loop may block for its relays' sake (the idle
// timeout, the linger), -1 for ever.
func (c *loopCore[T, R, N]) relayWait() time.Duration {
	var none N
	var oldest *time.Duration
	if c.idle.tail != none {
		oldest = &c.idle.tail.links().lastActive
	}
	return c.wait(c.slots.live, c.cfg.Linger, c.cfg.IdleTimeout, oldest)
}

// lingeredEmpty reports whether the loop has had no relay for the linger:
// it may park.
func (c *loopCore[T, R, N]) lingeredEmpty() bool {
	return c.slots.live == 0 && c.lingered(c.cfg.Linger)
}

// coreStats adds the loop's figures to st.
func (c *loopCore[T, R, N]) coreStats(st *Stats) {
	if c.q.isRunning() {
		st.Running++
	}
	c.addStats(st)
}
