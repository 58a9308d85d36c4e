package hbone

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Loop mode (docs/design/hbone-loop.md, step 3): a connection whose
// transport has a non-blocking face (loopTransport) can be driven by an
// event loop instead of its reader and writer goroutines. Config.Drive
// hands the loop a Driven; the loop calls it when the socket is readable or
// writable and once per iteration to flush, and hbone reaches the loop
// through the Owner it got back: Wake for frames committed by any
// goroutine, Close to end the connection. The protocol is the goroutine
// path's code: the read turn is the same pump (step), the write path the
// same buffer (c.pending), the close the same shutdown; only who does the
// socket I/O, and when, differs.

// loopTransport is the non-blocking face of a transport an event loop owns
// (mtls/record.Conn in fd mode, by method set). TryRead returns what is
// buffered or one socket read's worth; with nothing to return it returns
// (0, err), and err only means "wait for the next readable edge" when
// Drained then reports true (a would-block carries no error to report).
// Drained after a TryRead that returned bytes says that this very call read
// the socket and found it empty (never an earlier call's read: the edge
// that started the turn may have brought bytes since), so the read turn
// stops without the failing read edge-triggered polling does not need.
// TryWrite takes all of p (ok) or nothing; queued means the
// transport holds part of it for TryFlush, which the loop calls when the
// socket has room. It must take up to loopWriteMax bytes when it holds
// nothing. TryClose queues the transport's last words (close_notify or an
// owed alert) and reports whether they are out.
type loopTransport interface {
	TryRead(p []byte) (int, error)
	Drained() bool
	TryWrite(p []byte) (ok, queued bool, err error)
	TryFlush() (done bool, err error)
	TryClose() (done bool)
}

// Driven is the protocol side of a connection an event loop drives
// (engine.ConnDriver's method set, with its semantics; see Config.Drive).
// Every method is called on the loop's goroutine, one at a time, and none
// blocks.
type Driven interface {
	// Readable reads what the transport has and processes it (control
	// frames inline, DATA to the streams). more reports that its budget
	// ran out with input left: call it again after other work. An error
	// ends the connection; what hbone owes the peer (GOAWAY, an alert) is
	// queued for Flush and Writable.
	Readable() (more bool, err error)
	// Writable writes what the transport or the write buffer holds, when
	// the socket has room again; more reports that some is still held.
	Writable() (more bool, err error)
	// Flush writes what was committed since the last Flush, after a Wake.
	Flush() error
	// Tick is the loop's clock; hbone's timers are its own (AfterFunc).
	Tick(now time.Time)
	// Ended is the last call: the loop has finished with the socket
	// (err: why, nil after a clean close). The connection then ends as a
	// goroutine-driven one does: its streams fail, Done closes.
	Ended(err error)
}

// Owner is the event loop's handle for a driven connection
// (*engine.ConnHandle's method set). Wake asks for a Flush soon; Close
// ends the connection (abort: at once, nothing more sent; else after the
// connection's last bytes). Both may be called from any goroutine.
type Owner interface {
	Wake()
	Close(abort bool)
}

// localWaker is a stream Waker that can tell, given the Owner of the
// connection whose driver callback calls it, that it runs on the same
// event loop (engine.LocalWaker): it is then readied without a task.
type localWaker interface {
	WakeFrom(owner any)
}

const (
	// loopReadBudget and loopFrameBudget bound one read turn, so that one
	// busy connection does not starve the loop's other work.
	loopReadBudget  = 64 << 10
	loopFrameBudget = 16
	// loopWriteMax is the most one TryWrite is given: within
	// mtls/record's MaxTryWrite (256 KiB) with room to spare.
	loopWriteMax = 128 << 10
)

// How a close was asked of the owner (loopMode.closeAsked).
const (
	closeNone uint8 = iota
	closeGraceful
	closeAbrupt
)

// loopMode is a driven connection's loop state.
type loopMode struct {
	lt loopTransport

	// The owner, known once Drive returned; what was asked of it before
	// is owed (ownerMu).
	owner     atomic.Pointer[ownerBox]
	ownerMu   sync.Mutex
	wakeOwed  bool
	closeOwed bool
	abortOwed bool
	ended     atomic.Bool // Ended ran: the owner is gone

	// Guarded by conn.wmu.
	flushAsked bool  // a Wake is out and no Flush has taken the buffer since
	drop       bool  // an abrupt close: frames not yet written are dropped
	closeAsked uint8 // closeNone, closeGraceful, closeAbrupt

	// Loop goroutine only.
	out         *frameBuf // frames taken from c.pending, out.b[off:] not yet written
	off         int
	held        bool // the transport holds bytes for TryFlush
	closeQueued bool // TryClose ran
	readEnded   bool // the read side failed: Readable reads no more
}

type ownerBox struct{ o Owner }

// ownerOf returns the owner, nil before Drive returned.
func (lm *loopMode) ownerOf() Owner {
	if b := lm.owner.Load(); b != nil {
		return b.o
	}
	return nil
}

// wake asks the owner for a Flush (owed until the owner is known).
func (lm *loopMode) wake() {
	if o := lm.ownerOf(); o != nil {
		o.Wake()
		return
	}
	lm.ownerMu.Lock()
	o := lm.ownerOf()
	if o == nil {
		lm.wakeOwed = true
	}
	lm.ownerMu.Unlock()
	if o != nil {
		o.Wake()
	}
}

// close asks the owner to end the connection (owed until it is known).
func (lm *loopMode) close(abort bool) {
	lm.ownerMu.Lock()
	o := lm.ownerOf()
	if o == nil {
		lm.closeOwed = true
		lm.abortOwed = lm.abortOwed || abort
	}
	lm.ownerMu.Unlock()
	if o != nil && !lm.ended.Load() {
		o.Close(abort)
	}
}

// setOwner makes o the owner and passes on what was owed to it, with a
// first Wake: the frames newConn queued (preface, SETTINGS) are committed
// without one.
func (lm *loopMode) setOwner(o Owner) {
	lm.ownerMu.Lock()
	lm.owner.Store(&ownerBox{o: o})
	closeOwed, abort := lm.closeOwed, lm.abortOwed
	lm.ownerMu.Unlock()
	if lm.ended.Load() {
		return
	}
	o.Wake()
	if closeOwed {
		o.Close(abort)
	}
}

// driven is the Driven of a connection.
type driven struct {
	c  *conn
	lm *loopMode
}

func (d driven) Readable() (bool, error) { return d.c.readTurn(d.lm) }
func (d driven) Writable() (bool, error) { return d.c.writeTurn(d.lm) }
func (d driven) Tick(time.Time)          {}
func (d driven) Ended(err error)         { d.c.loopEnded(d.lm, err) }

func (d driven) Flush() error {
	if d.lm.held {
		return nil // Writable goes on when the socket has room
	}
	_, err := d.c.writeTurn(d.lm)
	return err
}

// startDriven offers the connection to Config.Drive, before it starts. On
// true an event loop drives it (its keepalive is armed, no goroutine is
// started); on false the caller starts the goroutines.
func (c *conn) startDriven() bool {
	drive := c.cfg.Drive
	if drive == nil {
		return false
	}
	lt, ok := c.nc.(loopTransport)
	if !ok {
		return false
	}
	lm := &loopMode{lt: lt}
	c.loop.Store(lm) // before Drive: the loop may call lm's conn at once
	o, ok := drive(c.nc, driven{c: c, lm: lm})
	if !ok || o == nil {
		c.loop.Store(nil)
		c.replayClose(lm)
		return false
	}
	c.mu.Lock()
	c.startKeepaliveLocked()
	c.mu.Unlock()
	c.wmu.Lock()
	lm.flushAsked = true // setOwner's Wake
	c.wmu.Unlock()
	lm.setOwner(o)
	return true
}

// replayClose closes, the goroutine way, a connection whose close was
// asked of an owner that Drive then did not give.
func (c *conn) replayClose(lm *loopMode) {
	c.wmu.Lock()
	asked := lm.closeAsked
	c.wmu.Unlock()
	switch asked {
	case closeGraceful:
		c.linger.Store(true)
		_ = c.nc.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	case closeAbrupt:
		c.closeConn(true)
	}
}

// loopClose is the transport's close in loop mode (shutdown, closeConn):
// the owner ends the connection once hbone's last bytes (GOAWAY, then
// close_notify or the owed alert) are written; an abrupt close drops the
// frames not yet written. An abrupt close after a graceful one cuts it
// short: the loop resets the socket (Ended still sends the transport's
// last words if it can, in one try).
func (c *conn) loopClose(lm *loopMode, abrupt bool) {
	c.wmu.Lock()
	escalate := abrupt && lm.closeAsked == closeGraceful
	first := lm.closeAsked == closeNone
	if abrupt {
		lm.drop = true
		lm.closeAsked = closeAbrupt
	} else if first {
		lm.closeAsked = closeGraceful
	}
	c.wmu.Unlock()
	if first || escalate {
		lm.close(escalate)
	}
}

// readOwner is what the read path hands to a stream's localWaker: the
// loop's owner in loop mode (the read path then runs on the loop, inside
// Readable), else nil.
func (c *conn) readOwner() any {
	if lm := c.loop.Load(); lm != nil {
		if o := lm.ownerOf(); o != nil {
			return o
		}
	}
	return nil
}

// wakeRead wakes s from the read path (see readOwner).
func (c *conn) wakeRead(s *Stream) {
	s.wakeFrom(c.readOwner())
}

// Owner returns the event loop's handle of the stream's connection (what
// Config.Drive returned), nil when goroutines drive the connection.
func (s *Stream) Owner() Owner {
	if lm := s.c.loop.Load(); lm != nil {
		return lm.ownerOf()
	}
	return nil
}

// readTurn is Readable: fill c.in through TryRead and step the pump until
// the transport is empty or the turn's budget is spent.
func (c *conn) readTurn(lm *loopMode) (more bool, err error) {
	if lm.readEnded {
		return false, nil
	}
	read, frames, drained := 0, 0, false
	for {
		for {
			progress, err := c.step()
			if err != nil {
				return false, c.endRead(lm, err)
			}
			if !progress {
				break
			}
			if c.state == stHeader {
				if frames++; frames >= loopFrameBudget {
					return true, nil // c.in may hold more: the next turn goes on
				}
			}
		}
		if c.inErr != nil {
			return false, c.endRead(lm, c.readErr(c.inErr))
		}
		if drained {
			// The last read found the socket empty and what it brought
			// is processed: wait for the next edge, without the failing
			// read.
			return false, nil
		}
		if read >= loopReadBudget {
			return true, nil
		}
		n, err := c.tryFill(lm)
		read += n
		switch {
		case err != nil && lm.lt.Drained():
			return false, nil // nothing until the next edge
		case err != nil:
			c.inErr = err // reported once c.in is processed, as fill does
		default:
			drained = lm.lt.Drained()
		}
	}
}

// tryFill is fill for the loop: one TryRead into c.in's tail (readRoom).
// Large DATA goes through c.in: the loop does not read
// straight into a stream's buffer.
func (c *conn) tryFill(lm *loopMode) (int, error) {
	space := c.readRoom()
	n, err := lm.lt.TryRead(space)
	if n < 0 || n > len(space) {
		n, err = 0, fmt.Errorf("hbone: transport read returned %d bytes", n)
	}
	c.inW += n
	if n == 0 {
		c.releaseIfEmpty()
		if err == nil {
			err = fmt.Errorf("hbone: transport read returned nothing")
		}
	}
	return n, err
}

// endRead ends the read side after the pump or the transport failed with
// err, and the connection with it (GOAWAY queued for a *ConnError). It
// returns err for Readable.
func (c *conn) endRead(lm *loopMode, err error) error {
	lm.readEnded = true
	c.releaseIn()
	c.closeWith(err)
	return err
}

// writeTurn writes what the transport holds, then the write buffer's
// frames, then, once the connection is closing and all is written, the
// transport's last words. held reports bytes left for the next Writable.
func (c *conn) writeTurn(lm *loopMode) (held bool, err error) {
	if lm.held {
		done, err := lm.lt.TryFlush()
		if err != nil {
			return false, c.loopWriteFailed(lm, err)
		}
		if !done {
			return true, nil
		}
		lm.held = false
	}
	for {
		if lm.out == nil {
			closing := c.takeOut(lm)
			if lm.out == nil {
				if closing && !lm.closeQueued && !c.writeFailed.Load() {
					lm.closeQueued = true
					if !lm.lt.TryClose() {
						lm.held = true
						return true, nil
					}
				}
				return false, nil
			}
		}
		for lm.off < len(lm.out.b) {
			p := lm.out.b[lm.off:]
			if len(p) > loopWriteMax {
				p = p[:loopWriteMax]
			}
			ok, queued, err := lm.lt.TryWrite(p)
			if err != nil {
				return false, c.loopWriteFailed(lm, err)
			}
			if !ok {
				lm.held = true
				return true, nil
			}
			lm.off += len(p)
			if queued {
				lm.held = true
				if lm.off == len(lm.out.b) {
					c.putOut(lm)
				}
				return true, nil
			}
		}
		c.putOut(lm)
	}
}

// takeOut takes the committed frames for writing (or drops them after an
// abrupt close), wakes whoever waits for room in the write buffer as the
// writer goroutine does when it takes it, and reports whether the write
// side is finished: closing, with nothing left to write.
func (c *conn) takeOut(lm *loopMode) (closing bool) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	lm.flushAsked = false
	if lm.drop && c.pending != nil {
		c.pending.b = c.pending.b[:0]
	}
	if c.pendingLenLocked() == 0 {
		c.releaseIdleLocked()
		return c.wclosing
	}
	lm.out, lm.off = c.takePendingLocked(lm.ownerOf()), 0
	return false
}

// putOut recycles the written frame buffer as the spare.
func (c *conn) putOut(lm *loopMode) {
	out := lm.out
	lm.out, lm.off = nil, 0
	c.wmu.Lock()
	c.recycleLocked(out)
	c.wmu.Unlock()
}

// loopWriteFailed ends the connection after the transport's write failed:
// as for the writer goroutine, nothing can follow what it cut.
func (c *conn) loopWriteFailed(lm *loopMode, err error) error {
	c.writeFailed.Store(true)
	if lm.out != nil {
		c.putOut(lm)
	}
	c.wmu.Lock()
	if !c.wclosing {
		c.wclosing = true
		c.wErr = connClosedError(err)
		c.bufCond.Broadcast()
	}
	c.wmu.Unlock()
	c.closeWith(fmt.Errorf("hbone: write: %w", err))
	return err
}

// loopEnded is Ended: the loop is done with the socket. The transport gets
// one last try at what it owes the peer if that was never queued (an
// aborted close, the loop's own end), the connection ends with err as its
// cause if nothing ended it before, and the reader's and writer's exits
// are counted, so that Done closes.
func (c *conn) loopEnded(lm *loopMode, err error) {
	lm.ended.Store(true)
	if !lm.closeQueued && !c.writeFailed.Load() {
		lm.closeQueued = true
		_ = lm.lt.TryClose()
	}
	cause := ErrConnClosed
	if err != nil {
		cause = fmt.Errorf("hbone: connection ended: %w", err)
	}
	c.closeWith(cause)
	lm.readEnded = true
	c.releaseIn()
	if lm.out != nil {
		c.putOut(lm)
	}
	close(c.readDone)
	c.closeNC.Do(func() { _ = c.nc.Close() })
	c.exit() // the reader's
	c.exit() // the writer's
}
