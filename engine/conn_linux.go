package engine

import (
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel/engine/poll"
	"golang.org/x/sys/unix"
)

// The epoll side of a loop-owned connection (contract in conn.go): a
// connEntry in a stream loop's slot table, beside the relays, registered
// In|Out|RDHup|ET once with tag side 0 like them.

// connState is where a connEntry is in its life.
type connState uint8

const (
	connOpen      connState = iota // the driver reads and writes
	connFlushing                   // closing: the driver's last bytes are going out
	connLingering                  // FIN sent: discarding input until the peer's EOF
)

// The bits of connEntry.flags, which other goroutines read and set.
const (
	// connFlushOwed: a Wake asked for a Flush that has not run yet.
	// Whoever sets it also arranges the Flush (a task, or the loop sees it
	// on leaving the entry).
	connFlushOwed uint32 = 1 << iota
	// connOnLoop: the loop runs code on the entry's behalf (a driver
	// callback, a relay of its streams) and looks at connFlushOwed when it
	// is done, so Wake needs no task.
	connOnLoop
)

// connEntry is a loop-owned connection. Its *ConnHandle is the entry
// itself (no allocation of its own).
type connEntry struct {
	relayBase
	l     *eloop
	d     ConnDriver
	fd    int
	flags atomic.Uint32 // connFlushOwed, connOnLoop

	// Owned by the loop goroutine.
	held     int // depth of enter: connOnLoop is set while > 0
	state    connState
	onFlush  bool          // in l.flush
	wrote    bool          // a Flush ran since the last Writable: room goes to Writable
	holding  bool          // the last Writable held bytes
	deadline time.Duration // loop time: end of the flushing or lingering phase
	closeErr error         // what Ended gets after a close that completes
	// A Close that reached the loop before the connection (Start after
	// it): addConn closes instead of the first read turn.
	closeOwed bool
	owedErr   error // the owed close's: ErrAborted if any asked to abort
}

// ConnHandle is a loop-owned connection seen from outside (TakeConn): it
// is what a Homed stream returns and the owner the driver wakes its
// streams' relays through (WakeLocal). Its methods but WakeLocal are safe
// from any goroutine.
type ConnHandle connEntry

func (h *ConnHandle) entry() *connEntry { return (*connEntry)(h) }

// Wake asks the loop to call the driver's Flush at the end of its current
// or next iteration. Wake-ups coalesce: a burst of commits costs one
// Flush, and while the loop runs code of this connection (or is awake
// anyway) no syscall.
func (h *ConnHandle) Wake() {
	c := h.entry()
	if c.flags.Or(connFlushOwed)&(connFlushOwed|connOnLoop) != 0 {
		return
	}
	c.l.submit(task{op: opConnWake, r: c})
}

// Close ends the connection on its loop. abort=false flushes first: the
// loop calls Flush (the driver writes its last bytes there and in
// Writable), sends the FIN once the driver holds nothing, waits for the
// peer's EOF (bounded) and closes; Ended gets nil. abort=true resets the
// socket at once, nothing more sent; Ended gets ErrAborted. Later calls,
// and calls after the end, do nothing.
func (h *ConnHandle) Close(abort bool) {
	var err error
	if abort {
		err = ErrAborted
	}
	h.entry().l.submit(task{op: opConnClose, r: h.entry(), err: err})
}

// Start hands the connection to its loop, which registers it, gives the
// driver a first read turn and a Flush (what was committed before Start
// goes out without a Wake). A Close asked before Start is done then
// instead, without the read turn. If the engine closed meanwhile, Ended
// (ErrClosed) runs on the caller's goroutine. Call it once.
func (h *ConnHandle) Start() {
	c := h.entry()
	if !c.l.submit(task{op: opConnAdd, r: c}) {
		c.refuse(ErrClosed)
	}
}

func (b *epollBackend) takeConn(fd int, d ConnDriver) *ConnHandle {
	c := &connEntry{l: b.strm[b.pick(len(b.strm))], d: d, fd: fd}
	c.init(c)
	return (*ConnHandle)(c)
}

// addConn registers a new connection and gives it its first read turn
// and a Flush, or the close asked before it came.
func (l *eloop) addConn(c *connEntry) {
	c.slot = l.slots.put(c)
	l.nConns.Add(1)
	const interest = poll.In | poll.Out | poll.RDHup | poll.ET
	if err := l.p.Add(c.fd, interest, uint64(c.slot)<<1); err != nil {
		c.finish(err, true)
		return
	}
	if c.closeOwed {
		c.close(c.owedErr)
		return
	}
	c.readable()
	l.markFlush(c)
}

// enter marks the loop as running code on c's behalf: a Wake meanwhile
// only sets connFlushOwed, which leave turns into a place on the flush
// list.
func (l *eloop) enter(c *connEntry) {
	if c.held == 0 {
		c.flags.Or(connOnLoop)
	}
	c.held++
}

func (l *eloop) leave(c *connEntry) {
	c.held--
	if c.held == 0 && c.flags.And(^connOnLoop)&connFlushOwed != 0 {
		l.markFlush(c)
	}
}

// markFlush puts c on the list the loop flushes at the end of the
// iteration (once, however often it is marked).
func (l *eloop) markFlush(c *connEntry) {
	if c.onFlush || c.closed || c.slot < 0 {
		// Not added yet (a Wake before Start): connFlushOwed stays set,
		// and addConn flushes.
		return
	}
	c.onFlush = true
	l.flush = append(l.flush, c)
}

// stalled counts a driver call that held the loop since start.
func (l *eloop) stalled(start time.Time) {
	if time.Since(start) > connStall {
		l.nStalls.Add(1)
	}
}

// readable gives the driver a read turn.
func (c *connEntry) readable() {
	l := c.l
	l.enter(c)
	start := time.Now()
	more, err := c.d.Readable()
	l.stalled(start)
	l.leave(c)
	if c.closed {
		return
	}
	if err != nil {
		c.startClose(err, connAbruptTimeout)
		return
	}
	if more && !c.queued && c.state == connOpen {
		// Back in line behind the loop's other work (runReady).
		c.queued = true
		l.ready = append(l.ready, loopRelay(c))
	}
}

// writable gives the driver the socket's room.
func (c *connEntry) writable() {
	l := c.l
	l.enter(c)
	start := time.Now()
	more, err := c.d.Writable()
	l.stalled(start)
	l.leave(c)
	c.wrote = false
	if c.closed {
		return
	}
	if err != nil {
		c.finish(err, true)
		return
	}
	c.holding = more
	if c.state == connFlushing && !more {
		c.shut()
	}
}

// flushNow runs the driver's Flush.
func (c *connEntry) flushNow() {
	l := c.l
	l.enter(c)
	// Cleared before the call: a commit during it sets the flag again and
	// gets a Flush of its own.
	c.flags.And(^connFlushOwed)
	start := time.Now()
	err := c.d.Flush()
	l.stalled(start)
	l.leave(c)
	c.wrote = true
	if err != nil && !c.closed {
		c.finish(err, true)
	}
}

// event records the socket's readiness and gives the driver its turns.
func (c *connEntry) event(_ int, ev poll.Event) {
	if ev.Events&poll.Err != 0 {
		if err := sockError(c.fd); err != nil {
			c.finish(err, true)
			return
		}
	}
	room := ev.Events&(poll.Out|poll.Hup|poll.Err) != 0
	input := ev.Events&(poll.In|poll.RDHup|poll.Hup|poll.Err) != 0
	switch c.state {
	case connOpen:
		if room && (c.wrote || c.holding) {
			c.writable()
		}
		if input && !c.closed && c.state == connOpen {
			c.readable()
		}
	case connFlushing:
		if room {
			c.writable()
		}
	case connLingering:
		if input {
			c.discard()
		}
	}
}

// service is a requeued read turn (Readable said more).
func (c *connEntry) service() {
	if !c.closed && c.state == connOpen {
		c.readable()
	}
}

// startClose begins a close that flushes: the driver's Flush, then its
// Writable until it holds nothing, within bound.
func (c *connEntry) startClose(err error, bound time.Duration) {
	if c.closed || c.state != connOpen {
		return
	}
	l := c.l
	c.state, c.closeErr = connFlushing, err
	c.deadline = l.now + bound
	l.closing = append(l.closing, c)
	c.flushNow()
	if c.closed {
		return
	}
	// Whether the Flush left bytes held: Writable says (at worst one
	// write that meets a full socket again).
	c.writable()
}

// shut sends the FIN once the driver's bytes are out, and lingers for the
// peer's.
func (c *connEntry) shut() {
	l := c.l
	c.state = connLingering
	c.deadline = l.now + connLinger
	if err := unix.Shutdown(c.fd, unix.SHUT_WR); err != nil && err != unix.ENOTCONN {
		c.finish(c.closeErr, false)
		return
	}
	c.discard() // input that came while flushing brought its edge then
}

// discard reads and drops the input of a lingering connection until
// EAGAIN; the peer's EOF (or an error) ends the connection.
func (c *connEntry) discard() {
	buf := c.l.scratchBuf()
	for {
		n, err := unix.Read(c.fd, buf)
		switch {
		case err == unix.EAGAIN:
			return
		case err == unix.EINTR:
			continue
		case err != nil || n == 0:
			c.finish(c.closeErr, false)
			return
		}
	}
}

// close is Close on the loop. Before the connection is added (a Close
// before Start) it is owed to addConn.
func (c *connEntry) close(err error) {
	if c.closed {
		return
	}
	if c.slot < 0 {
		c.closeOwed = true
		if err != nil {
			c.owedErr = err
		}
		return
	}
	if err != nil {
		c.finish(err, true)
		return
	}
	c.startClose(nil, connFlushTimeout)
}

// expireConns ends the closing connections whose phase outlasted its
// bound: a flush that did not finish resets, a linger closes.
func (l *eloop) expireConns() {
	for i := 0; i < len(l.closing); {
		c := l.closing[i]
		if l.now < c.deadline {
			i++
			continue
		}
		// finish removes c from the list.
		if c.state == connFlushing {
			c.finish(errCloseFlush, true)
		} else {
			c.finish(c.closeErr, false)
		}
	}
}

// flushConns runs the Flush of every connection marked in the iteration;
// those marked again meanwhile wait for the next one.
func (l *eloop) flushConns() {
	if len(l.flush) == 0 {
		return
	}
	batch := l.flush
	l.flush = l.spareFlush[:0]
	for i, c := range batch {
		batch[i] = nil
		c.onFlush = false
		if !c.closed && c.state != connLingering {
			c.flushNow()
		}
	}
	l.spareFlush = batch[:0]
}

// connWait shortens the loop's wait for its connections: a flush owed
// now, the end of a close phase.
func (l *eloop) connWait(t time.Duration) time.Duration {
	if len(l.flush) > 0 {
		return 0
	}
	at := func(deadline time.Duration) {
		left := max(deadline-l.now, 0)
		if t < 0 || left < t {
			t = left
		}
	}
	for _, c := range l.closing {
		at(c.deadline)
	}
	return t
}

// finish ends the connection: Ended (the descriptor still open), then the
// descriptor closed (reset when rst), the slot freed.
func (c *connEntry) finish(err error, rst bool) {
	if c.closed {
		return
	}
	l := c.l
	c.closed = true
	for i, o := range l.closing {
		if o == c {
			last := len(l.closing) - 1
			l.closing[i] = l.closing[last]
			l.closing[last] = nil
			l.closing = l.closing[:last]
			break
		}
	}
	start := time.Now()
	c.d.Ended(err)
	l.stalled(start)
	if rst {
		abortFD(c.fd)
	} else {
		_ = unix.Close(c.fd)
	}
	l.slots.drop(c.slot)
	if l.slots.live == 0 {
		l.emptySince = l.now
	}
	l.nConns.Add(-1)
	l.b.e.connEnded()
}

// end is the loopRelay form of finish (a registration that failed, the
// loop's stop).
func (c *connEntry) end(err error, abort bool) { c.finish(err, abort) }

// refuse ends a connection whose loop stopped before adding it.
func (c *connEntry) refuse(err error) {
	c.closed = true
	c.d.Ended(err)
	_ = unix.Close(c.fd)
	c.l.b.e.connEnded()
}

func (c *connEntry) fdOf(side int) int {
	if side == 0 {
		return c.fd
	}
	return -1
}

// WakeLocal wakes w, the Waker of a stream of the connection, from inside
// one of the connection's ConnDriver callbacks: an epoll relay of the
// connection's own loop goes straight onto the loop's ready list (no
// task, no lock, Stats.LocalWakes); anything else (a relay of another
// loop, a blocking stream's waker) gets w.Wake(). The parameter is an
// unnamed interface so that a driver's package can declare the method
// without importing this one (hbone.Owner). Calling it outside a driver
// callback of h is a contract violation (checked in assert builds).
func (h *ConnHandle) WakeLocal(w interface{ Wake() }) {
	c := h.entry()
	r, ok := w.(*streamRelay)
	if !ok || r.l != c.l {
		w.Wake()
		return
	}
	if assertions && c.held == 0 {
		panic("engine: WakeLocal outside a driver callback of its connection")
	}
	r.l.nLocalWakes.Add(1)
	if !r.queued && !r.closed && r.slot >= 0 {
		r.queued = true
		r.l.ready = append(r.l.ready, loopRelay(r))
	}
}
