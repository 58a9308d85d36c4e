package hbone

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// goDriver is the goroutine driver: a reader goroutine (readLoop) feeds
// the pump with one blocking Read per fill, and a writer goroutine
// (writeLoop) flushes the write buffer with one Write per batch, so what
// is committed while a Write is in progress goes out in the next one. It
// drives the connections no event loop takes: inner tunnels (over
// crypto/tls on a Stream), the std and uring backends, connections
// crypto/tls protects, clients without an engine.
//
// Lock rules: the fields under c.wmu are the writer's hand-off; the reader
// goroutine owns the pump (c.in and the parser state) without a lock.
type goDriver struct {
	c *conn

	// Guarded by c.wmu.
	writerWaiting bool
	writerCond    sync.Cond // L: c.wmu

	closeNC sync.Once
	linger  atomic.Bool // close gracefully: flush, half-close, wait for the peer
	// writeFailed: the writer's write failed, so the transport owes the
	// peer nothing it could still send.
	writeFailed atomic.Bool
	readDone    chan struct{} // closed when the reader has stopped reading
}

func newGoDriver(c *conn) *goDriver {
	g := &goDriver{c: c, readDone: make(chan struct{})}
	g.writerCond.L = &c.wmu
	return g
}

// start starts the writer goroutine; the caller runs readLoop (on a new
// goroutine or its own).
func (g *goDriver) start() {
	go g.writeLoop()
}

// readLoop runs the reader until the connection ends.
func (g *goDriver) readLoop() {
	c := g.c
	err := g.readFrames()
	c.in.release()
	close(g.readDone)
	c.closeWith(err)
	c.exit()
}

// readFrames is the reader's loop: the pump (pump.go) steps through what
// c.in holds and, when it needs more, one blocking read fills it. It
// returns why the connection must end: a *ConnError (answered with
// GOAWAY), a network error, or ErrBadPreface.
func (g *goDriver) readFrames() error {
	c := g.c
	for {
		progress, err := c.step()
		if err != nil {
			return err
		}
		if !progress {
			if err := g.fill(); err != nil {
				return c.readErr(err)
			}
		}
	}
}

// fill is one blocking Read into c.in's tail (readRoom). A read error is
// kept and returned once what came before it is processed (the caller
// steps until no progress, then fills again).
func (g *goDriver) fill() error {
	c := g.c
	if c.in.err != nil {
		return c.in.err
	}
	if c.in.buf == nil && c.state == stData && c.data.s != nil && c.data.left >= inSmallSize {
		if done, err := g.fillStream(&c.data); done {
			return err
		}
	}
	space := c.readRoom()
	for range 100 { // as bufio: a transport that keeps returning nothing is broken
		n, err := c.nc.Read(space)
		c.in.w += n
		if err != nil {
			c.in.err = err
			if n == 0 {
				c.in.releaseIfEmpty()
				return err
			}
		}
		if n > 0 {
			return nil
		}
	}
	c.in.err = io.ErrNoProgress
	return c.in.err
}

// fillStream is fill in the middle of a large DATA payload that no
// DirectSink can take now: the read goes straight into the stream's buffer
// (as far as the payload goes), saving the copy through c.in. It runs
// outside s.mu, so the stream's reader keeps draining older data
// meanwhile; s.filling keeps the tail chunk alive until the read is done.
// done is false when the stream's sink may take the bytes or the stream
// was reset: then the bytes go through c.in.
func (g *goDriver) fillStream(d *dataState) (done bool, err error) {
	s := d.s
	s.mu.Lock()
	if ref := s.waker.Load(); s.rerrNow != nil || (ref != nil && ref.sink != nil && s.rbuf.size == 0) {
		s.mu.Unlock()
		return false, nil
	}
	dst := s.rbuf.reserve(d.left)
	s.filling = true
	s.mu.Unlock()
	n, err := g.c.nc.Read(dst)
	s.mu.Lock()
	s.filling = false
	if s.rerrNow != nil {
		if !s.peeking {
			s.rbuf.free() // else the Consume that ends the Peek does
		}
		d.dropped += n
	} else if n > 0 {
		s.rbuf.commit(n)
		s.wakeReaderLocked()
		s.wake()
	}
	if n == 0 && s.rbuf.size == 0 && !s.peeking {
		s.rbuf.free() // the chunk reserved for nothing
	}
	s.mu.Unlock()
	d.left -= n
	if err != nil {
		g.c.in.err = err
		if n == 0 {
			return true, err
		}
	}
	return true, nil
}

// committedLocked wakes the writer if it waits. Only the writer writes:
// measured, letting committers write small batches themselves cost the
// connection rate ~10% (the writer's syscalls no longer ran beside the
// reader's work on the other core) for no clear latency gain. c.wmu held.
func (g *goDriver) committedLocked() {
	g.wakeWriterLocked()
}

// wakeWriterLocked wakes the writer if it waits. c.wmu held.
func (g *goDriver) wakeWriterLocked() {
	if g.writerWaiting {
		g.writerWaiting = false
		g.writerCond.Signal()
	}
}

// lentWriter is a transport whose Write can borrow the caller's buffer
// for the call (mtls/record.Conn, by method set): WriteLent may change p's
// bytes, and the byte after p within cap(p), as long as it restores them
// before it returns.
type lentWriter interface {
	WriteLent(p []byte) (int, error)
}

// writeLoop flushes the pending buffer with one Write per batch: whatever
// streams append while a Write is in progress goes out in the next one.
func (g *goDriver) writeLoop() {
	c := g.c
	defer c.exit()
	var err error
	c.wmu.Lock()
	for {
		if c.pendingLenLocked() == 0 {
			if c.wclosing {
				break
			}
			c.releaseIdleLocked()
			g.writerWaiting = true
			g.writerCond.Wait()
			g.writerWaiting = false
			continue
		}
		out := c.takePendingLocked(nil)
		c.wmu.Unlock()
		// One Write per batch (the daemon's mtls/record connection seals
		// it and sends it with one syscall). out is the writer's alone
		// until recycled, so it can be lent: records are sealed straight
		// from it.
		if lw, ok := c.nc.(lentWriter); ok {
			_, err = lw.WriteLent(out.b)
		} else {
			_, err = c.nc.Write(out.b)
		}
		c.wmu.Lock()
		c.recycleLocked(out)
		if err != nil {
			break
		}
	}
	if err != nil {
		c.failWritesLocked(err)
	}
	c.wmu.Unlock()
	if err == nil && g.linger.Load() {
		g.lingerClose()
	}
	if err != nil {
		// The transport's write side failed: nothing, not even a TLS
		// alert, can follow what it cut. The cause is recorded before the
		// close, which would make the reader fail too.
		g.writeFailed.Store(true)
		c.closeWith(fmt.Errorf("hbone: write: %w", err))
	}
	g.closeNow(err != nil)
}

// lingerClose half-closes a flushed connection and waits a little for the
// peer to close its side: closing at once, with peer bytes unread, makes
// the kernel reset the connection, and a reset can destroy the frames we
// just sent (GOAWAY above all) before the peer reads them.
func (g *goDriver) lingerClose() {
	if cw, ok := g.c.nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	t := time.NewTimer(lingerTimeout)
	defer t.Stop()
	select {
	case <-g.readDone:
	case <-t.C:
	}
}

// close: a graceful close is the writer's, once it has flushed what is
// queued (see writeLoop), bounded so that a peer that stopped reading does
// not hold it forever; an abrupt one closes the transport now. Either way
// the writer is woken to find the write side closing (or the transport
// closed) and exit.
func (g *goDriver) close(abrupt bool) {
	if abrupt {
		g.closeNow(true)
	} else {
		g.linger.Store(true)
		_ = g.c.nc.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	}
	g.c.wmu.Lock()
	g.wakeWriterLocked()
	g.c.wmu.Unlock()
}

// closeNow closes the network connection, once, always through the
// transport's own Close: a TLS transport then sends what it owes the peer
// (close_notify, RFC 8446 section 6.1, or the fatal alert a failed read
// left owed, section 6.2), whichever side ended the connection and
// however. An abrupt close bounds that: to a peer that stopped reading,
// crypto/tls blocks on its close_notify for up to five seconds, holding
// the connection and its goroutines, so the transport under a TLS
// connection is closed after abruptCloseTimeout if Close has not returned
// (mtls/record bounds its own Close more tightly). After a failed write
// there is nothing left to send, and that transport is closed at once.
func (g *goDriver) closeNow(abrupt bool) {
	g.closeNC.Do(func() {
		if u, ok := g.c.nc.(interface{ NetConn() net.Conn }); ok && abrupt {
			if g.writeFailed.Load() {
				_ = u.NetConn().Close()
			} else {
				t := time.AfterFunc(abruptCloseTimeout, func() { _ = u.NetConn().Close() })
				defer t.Stop()
			}
		}
		_ = g.c.nc.Close()
	})
}

func (g *goDriver) owner() Owner { return nil }
