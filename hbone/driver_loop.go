package hbone

import (
	"fmt"
	"sync/atomic"
)

// The loop driver (docs/design/hbone-loop.md, step 3): a connection whose
// transport has a non-blocking face (loopTransport) can be driven by an
// event loop instead of the goroutine driver. Config.Drive hands the loop a
// Driven (the loopDriver); the loop calls it when the socket is readable or
// writable and once per iteration to flush, and hbone reaches the loop
// through the Owner it got back: Wake for frames committed by any
// goroutine, Close to end the connection. The protocol is the connection's
// (driver.go): the read turn steps the same pump, the write turn writes
// the same buffer (c.pending), the close is the same shutdown.

// loopTransport is the non-blocking face of a transport an event loop owns
// (mtls/record.Conn in fd mode, by method set). TryRead returns what is
// buffered or one socket read's worth; with nothing to return it returns
// (0, err), and err only means "wait for the next readable edge" when
// Drained then reports true (a would-block carries no error to report).
// Drained after a TryRead that returned bytes says that this very call read
// the socket and found it empty (never an earlier call's read: the edge
// that started the turn may have brought bytes since), so the read turn
// stops without the failing read edge-triggered polling does not need.
// TryWriteLent takes all of p (ok) or nothing; queued means the
// transport holds part of it for TryFlush, which the loop calls when the
// socket has room. It must take up to loopWriteMax bytes when it holds
// nothing. p is lent for the call: the transport may change its bytes, and
// the byte after it within cap(p), as long as it restores them before it
// returns (mtls/record seals its records straight from the write buffer so,
// without copying them first). The loop's write buffer is its own while
// it writes it, so nothing else sees the change. TryClose queues the transport's last words (close_notify or an
// owed alert) and reports whether they are out.
type loopTransport interface {
	TryRead(p []byte) (int, error)
	Drained() bool
	TryWriteLent(p []byte) (ok, queued bool, err error)
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
	// Ended is the last call: the loop has finished with the socket
	// (err: why, nil after a clean close). The connection then ends as a
	// goroutine-driven one does: its streams fail, Done closes.
	Ended(err error)
}

// Owner is the event loop's handle for a driven connection
// (*engine.ConnHandle's method set). Config.Drive returns it before the
// loop may call the Driven; Start (called once, by hbone, when the
// connection may run) hands the connection to the loop, which then reads
// it and flushes what was committed before. Wake asks for a Flush soon;
// Close ends the connection (abort: at once, nothing more sent; else after
// the connection's last bytes). Wake and Close may be called from any
// goroutine, before Start too: the loop does what they asked once it has
// the connection.
//
// WakeLocal is called only from inside one of the loop's Driven callbacks
// for this connection (the read path waking a stream, a Flush making
// write-buffer room): it wakes w, a stream's Waker, knowing that the loop
// calls it, so that the loop can ready a relay of its own at once (no
// task, no lock) and Wake anything else. Its parameter is an unnamed
// interface so that the engine's handle declares the same method without
// importing hbone.
type Owner interface {
	Start()
	Wake()
	Close(abort bool)
	WakeLocal(w interface{ Wake() })
}

const (
	// loopReadBudget and loopFrameBudget bound one read turn, so that one
	// busy connection does not starve the loop's other work.
	loopReadBudget  = 64 << 10
	loopFrameBudget = 16
	// loopWriteMax is the most one TryWriteLent is given: within
	// mtls/record's MaxTryWrite (256 KiB) with room to spare.
	loopWriteMax = 128 << 10
)

// How a close was asked of the owner (loopDriver.closeAsked).
const (
	closeNone uint8 = iota
	closeGraceful
	closeAbrupt
)

// loopDriver drives a connection from an event loop; it is the Driven
// Config.Drive gets.
//
// Lock rules: own is set before the connection is published and never
// changes; what commits and closes ask of the loop is under c.wmu; the
// read and write turns' state is the loop goroutine's alone (its callbacks
// run one at a time).
type loopDriver struct {
	c     *conn
	lt    loopTransport
	own   Owner       // what Drive returned, before anything could call it
	ended atomic.Bool // Ended ran: the owner is gone

	// Guarded by c.wmu.
	// flushAsked: a Wake is out (or the Flush that follows Start, for
	// the preface and SETTINGS newConn queued) and no Flush has taken
	// the buffer since.
	flushAsked bool
	drop       bool  // an abrupt close: frames not yet written are dropped
	closeAsked uint8 // closeNone, closeGraceful, closeAbrupt

	// Loop goroutine only.
	out         *frameBuf // frames taken from c.pending, out.b[off:] not yet written
	off         int
	held        bool // the transport holds bytes for TryFlush
	closeQueued bool // TryClose ran
	readEnded   bool // the read side failed: Readable reads no more
	writeFailed bool // a write failed: the transport owes the peer nothing more
}

// owner is the loop's handle.
func (l *loopDriver) owner() Owner { return l.own }

// committedLocked asks the loop for a Flush, one Wake until it runs.
// c.wmu held.
func (l *loopDriver) committedLocked() {
	if !l.flushAsked {
		l.flushAsked = true
		l.own.Wake()
	}
}

// close: the owner ends the connection once hbone's last bytes (GOAWAY,
// then close_notify or the owed alert) are written; an abrupt close drops
// the frames not yet written. An abrupt close after a graceful one cuts it
// short: the loop resets the socket (Ended still sends the transport's
// last words if it can, in one try).
func (l *loopDriver) close(abrupt bool) {
	c := l.c
	c.wmu.Lock()
	escalate := abrupt && l.closeAsked == closeGraceful
	first := l.closeAsked == closeNone
	if abrupt {
		l.drop = true
		l.closeAsked = closeAbrupt
	} else if first {
		l.closeAsked = closeGraceful
	}
	c.wmu.Unlock()
	if (first || escalate) && !l.ended.Load() {
		l.own.Close(escalate)
	}
}

// Readable is a read turn: fill c.in through TryRead and step the pump
// until the transport is empty or the turn's budget is spent.
func (l *loopDriver) Readable() (more bool, err error) {
	c := l.c
	if l.readEnded {
		return false, nil
	}
	read, frames, drained := 0, 0, false
	for {
		for {
			progress, err := c.step()
			if err != nil {
				return false, l.endRead(err)
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
		if c.in.err != nil {
			return false, l.endRead(c.readErr(c.in.err))
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
		n, err := l.tryFill()
		read += n
		switch {
		case err != nil && l.lt.Drained():
			return false, nil // nothing until the next edge
		case err != nil:
			c.in.err = err // reported once c.in is processed, as fill does
		default:
			drained = l.lt.Drained()
		}
	}
}

// tryFill is one TryRead into c.in's tail (readRoom). Large DATA goes
// through c.in: the loop does not read straight into a stream's buffer.
func (l *loopDriver) tryFill() (int, error) {
	c := l.c
	space := c.readRoom()
	n, err := l.lt.TryRead(space)
	if n < 0 || n > len(space) {
		n, err = 0, fmt.Errorf("hbone: transport read returned %d bytes", n)
	}
	c.in.w += n
	if n == 0 {
		c.in.releaseIfEmpty()
		if err == nil {
			err = fmt.Errorf("hbone: transport read returned nothing")
		}
	}
	return n, err
}

// endRead ends the read side after the pump or the transport failed with
// err, and the connection with it (GOAWAY queued for a *ConnError). It
// returns err for Readable.
func (l *loopDriver) endRead(err error) error {
	c := l.c
	l.readEnded = true
	c.in.release()
	c.closeWith(err)
	return err
}

// Writable is a write turn: it writes what the transport holds, then the
// write buffer's frames, then, once the connection is closing and all is
// written, the transport's last words. held reports bytes left for the
// next Writable.
func (l *loopDriver) Writable() (held bool, err error) {
	if l.held {
		done, err := l.lt.TryFlush()
		if err != nil {
			return false, l.writeFailedWith(err)
		}
		if !done {
			return true, nil
		}
		l.held = false
	}
	for {
		if l.out == nil {
			closing := l.takeOut()
			if l.out == nil {
				if closing && !l.closeQueued && !l.writeFailed {
					l.closeQueued = true
					if !l.lt.TryClose() {
						l.held = true
						return true, nil
					}
				}
				return false, nil
			}
		}
		for l.off < len(l.out.b) {
			p := l.out.b[l.off:]
			if len(p) > loopWriteMax {
				p = p[:loopWriteMax]
			}
			ok, queued, err := l.lt.TryWriteLent(p)
			if err != nil {
				return false, l.writeFailedWith(err)
			}
			if !ok {
				l.held = true
				return true, nil
			}
			l.off += len(p)
			if queued {
				l.held = true
				if l.off == len(l.out.b) {
					l.putOut()
				}
				return true, nil
			}
		}
		l.putOut()
	}
}

// Flush writes what was committed since the last Flush, unless the
// transport holds bytes: Writable goes on when the socket has room.
func (l *loopDriver) Flush() error {
	if l.held {
		return nil
	}
	_, err := l.Writable()
	return err
}

// takeOut takes the committed frames for writing (or drops them after an
// abrupt close), wakes whoever waits for room in the write buffer as the
// writer goroutine does when it takes it, and reports whether the write
// side is finished: closing, with nothing left to write.
func (l *loopDriver) takeOut() (closing bool) {
	c := l.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	l.flushAsked = false
	if l.drop && c.pending != nil {
		c.pending.b = c.pending.b[:0]
	}
	if c.pendingLenLocked() == 0 {
		c.releaseIdleLocked()
		return c.wclosing
	}
	l.out, l.off = c.takePendingLocked(l.own), 0
	return false
}

// putOut recycles the written frame buffer as the spare.
func (l *loopDriver) putOut() {
	c := l.c
	out := l.out
	l.out, l.off = nil, 0
	c.wmu.Lock()
	c.recycleLocked(out)
	c.wmu.Unlock()
}

// writeFailedWith ends the connection after the transport's write failed:
// as for the writer goroutine, nothing can follow what it cut.
func (l *loopDriver) writeFailedWith(err error) error {
	c := l.c
	l.writeFailed = true
	if l.out != nil {
		l.putOut()
	}
	c.wmu.Lock()
	c.failWritesLocked(err)
	c.wmu.Unlock()
	c.closeWith(fmt.Errorf("hbone: write: %w", err))
	return err
}

// Ended: the loop is done with the socket. The transport gets one last try at what it owes the peer if that was never queued (an
// aborted close, the loop's own end), the connection ends with err as its
// cause if nothing ended it before, and the reader's and writer's exits
// are counted, so that Done closes.
func (l *loopDriver) Ended(err error) {
	c := l.c
	l.ended.Store(true)
	if !l.closeQueued && !l.writeFailed {
		l.closeQueued = true
		_ = l.lt.TryClose()
	}
	cause := ErrConnClosed
	if err != nil {
		cause = fmt.Errorf("hbone: connection ended: %w", err)
	}
	c.closeWith(cause)
	l.readEnded = true
	c.in.release()
	if l.out != nil {
		l.putOut()
	}
	_ = c.nc.Close() // only Ended closes a loop-driven transport
	c.exit()         // the reader's
	c.exit()         // the writer's
}
