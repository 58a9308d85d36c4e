package record

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
)

// This file is the connection's face for an event loop that owns the
// socket's descriptor and its readiness (fd mode, docs/design/hbone-loop.md,
// "The seam"): after UseFD every socket read and write is one non-blocking
// system call on the descriptor, made by a Try method; nothing waits,
// nothing goes through the runtime's poller, and the connection never closes
// the descriptor. The record protocol itself (what a record may carry,
// KeyUpdate, alerts, the bounds) is the blocking path's code: TryRead runs
// readLocked, TryWrite sealLocked.

// ErrWouldBlock is what TryRead returns when the socket has no bytes for
// it: the caller waits for the descriptor to become readable.
var ErrWouldBlock = errors.New("record: operation would block")

// ErrFDMode is what the blocking methods (Read, Write, Flush, KeyUpdate,
// CloseWrite) return once UseFD has handed the connection a descriptor:
// their waiting would happen in the runtime's poller, which no longer
// watches the socket. Close still works, without touching the descriptor.
var ErrFDMode = fmt.Errorf("record: blocking call on a connection in fd mode: %w", errors.ErrUnsupported)

// errNoFD is what the fd-mode methods return on a connection without one.
var errNoFD = fmt.Errorf("record: connection not in fd mode (UseFD): %w", errors.ErrUnsupported)

// errBusy refuses UseFD while a blocking Read or Write runs: it would go on
// with the old socket.
var errBusy = errors.New("record: UseFD while a Read or Write is in progress")

// UseFD switches the connection to fd mode: from now on its socket I/O is
// plain non-blocking read and write system calls on fd, a descriptor of the
// same socket that the caller owns (typically a dup, with the net.Conn
// closed so that the runtime's poller lets go of it). UseFD sets fd
// non-blocking. It refuses before the handshake completed, when crypto/tls
// keeps the data, after Close, and while a Read or Write is in progress.
// Bytes already read stay buffered (records that came with the handshake's
// last flight): the first TryRead returns them without new bytes on the
// socket. Records a TryWrite left held are sent by TryFlush. In fd mode
// deadlines do not apply and the blocking methods return ErrFDMode.
func (c *Conn) UseFD(fd int) error {
	if fd < 0 {
		return fmt.Errorf("record: UseFD(%d): not a descriptor", fd)
	}
	if !c.hsDone.Load() {
		return errors.New("record: UseFD before the handshake completed")
	}
	if c.fallback {
		return fmt.Errorf("record: UseFD on a connection crypto/tls protects: %w", errors.ErrUnsupported)
	}
	if !c.rmu.TryLock() {
		return errBusy
	}
	defer c.rmu.Unlock()
	if !c.wmu.TryLock() {
		return errBusy
	}
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return net.ErrClosed
	}
	if c.fdMode.Load() {
		return errors.New("record: UseFD called twice")
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		return os.NewSyscallError("fcntl", err)
	}
	c.fd = fd
	c.drained = false // the caller's first read turn must read
	c.fdMode.Store(true)
	return nil
}

// TryRead is Read without waiting, in fd mode: it returns plaintext already
// decrypted, then opens the complete records already buffered (straight
// into p when it has room for the record, as Read does), and reads the
// socket once more only when it has nothing to return. With nothing to
// return and an empty socket it returns (0, ErrWouldBlock), which is not
// sticky. Otherwise its results are Read's: io.EOF after close_notify,
// io.ErrUnexpectedEOF, a *ProtocolError (the alert is then owed: TryWrite
// or TryClose queues it), an AlertError; KeyUpdate, NewSessionTicket and
// the bound on records without data are handled inside as Read does.
func (c *Conn) TryRead(p []byte) (int, error) {
	if !c.fdMode.Load() {
		return 0, errNoFD
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	if len(p) == 0 {
		return 0, nil
	}
	// Only a socket read made by this call may say the socket is drained:
	// a call served from what earlier reads buffered says nothing of the
	// bytes (and the edge) that arrived since, and a caller that trusted
	// an earlier short read would leave them unread.
	c.drained = false
	n, err := c.readLocked(p)
	c.releaseIfEmptyLocked()
	if n > 0 {
		return n, nil
	}
	return 0, err
}

// Drained reports whether an edge-triggered caller may stop reading until
// the descriptor's next readable edge: the last TryRead read the socket and
// got less than it asked for, and what is buffered cannot make a TryRead return
// anything without new bytes (no plaintext, no complete record, no error
// to report). When it is false, the caller calls TryRead again.
func (c *Conn) Drained() bool {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if !c.fdMode.Load() || c.closed.Load() || !c.drained || len(c.plain) > 0 || c.rerr != nil {
		return false
	}
	if avail := c.w - c.r; avail >= headerLen {
		hdr := (*c.rb)[c.r : c.r+headerLen]
		length := int(hdr[3])<<8 | int(hdr[4])
		if hdr[0] != typeApplicationData || length > maxCiphertext || avail >= headerLen+length {
			return false // a record to open, or a header to fail on
		}
	}
	return true
}

// readFDLocked is fillLocked's socket read in fd mode: one non-blocking
// read into buf's tail.
func (c *Conn) readFDLocked(buf []byte) error {
	var n int
	var err error
	for {
		n, err = syscall.Read(c.fd, buf[c.w:])
		if err != syscall.EINTR {
			break
		}
	}
	if err == nil && n > 0 {
		c.drained = c.w+n < len(buf)
		c.w += n
		return nil
	}
	c.drained = true
	c.releaseIfEmptyLocked()
	switch {
	case err == syscall.EAGAIN:
		return ErrWouldBlock
	case err != nil:
		return os.NewSyscallError("read", err)
	}
	return io.EOF
}

// tryWriteFDLocked is TryWrite (TryWriteLent with lent) in fd mode (see there). Held records are
// sent first; p is sealed behind whatever stays held only when both fit in
// the held buffer without growing it, so at most one output buffer is ever
// held per connection.
func (c *Conn) tryWriteFDLocked(p []byte, lent bool) (ok, queued bool, err error) {
	if err := c.writableLocked(); err != nil {
		return true, c.unsent != nil, err
	}
	stillHeld := false
	if c.unsent != nil {
		if err := c.sendHeldLocked(); err != nil {
			return true, false, err
		}
		if c.unsent != nil {
			if len(c.unsent)+sealRoom(len(p)) > cap(*c.backlog) {
				return false, true, nil
			}
			stillHeld = true
		}
	}
	buf, start := c.heldBufLocked(sealRoom(len(p)))
	buf, err = c.sealAllLocked(buf, p, lent)
	c.holdLocked(buf, start)
	if err != nil {
		return true, c.unsent != nil, err
	}
	if stillHeld {
		return true, true, nil // the socket has just refused more
	}
	if err := c.sendHeldLocked(); err != nil {
		return true, false, err
	}
	return true, c.unsent != nil, nil
}

// sealRoom is the free room sealLocked needs to take all of n bytes (at
// most MaxTryWrite) in one call: before each record it wants room for a
// full one and a KeyUpdate, and a KeyUpdate may come first.
func sealRoom(n int) int {
	r := (n + maxPlaintext - 1) / maxPlaintext
	return r*sealedLen + (r+1)*ctrlRecordLen
}

// TryFlush sends, without waiting, the records TryWrite, TryKeyUpdate or
// TryClose left held, in fd mode: the caller calls it when the descriptor
// becomes writable. done reports that nothing is held any more; err is the
// socket's error if this write failed (the held records are then dropped:
// a record may have been cut, so the write side has failed for good).
func (c *Conn) TryFlush() (done bool, err error) {
	if !c.fdMode.Load() {
		return false, errNoFD
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return true, net.ErrClosed
	}
	if c.unsent == nil {
		return true, nil
	}
	if err := c.sendHeldLocked(); err != nil {
		return true, err
	}
	return c.unsent == nil, nil
}

// TryKeyUpdate is KeyUpdate in fd mode: it queues a KeyUpdate (asking the
// peer to update too when requestPeer) behind the held records, moves the
// write keys on, and tries to send; what the socket does not take is held
// for TryFlush.
func (c *Conn) TryKeyUpdate(requestPeer bool) error {
	if !c.fdMode.Load() {
		return errNoFD
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.writableLocked(); err != nil {
		return err
	}
	// Our KeyUpdate also answers one the peer requested.
	c.pendingKeyUpdate.Store(false)
	buf, start := c.heldBufLocked(ctrlRecordLen)
	buf, err := c.appendKeyUpdateLocked(buf, requestPeer)
	c.holdLocked(buf, start)
	if err != nil {
		return err
	}
	return c.sendHeldLocked()
}

// TryClose ends the write side in fd mode: it queues close_notify, or the
// fatal alert a failed read owes the peer (RFC 8446 sections 6.1 and 6.2),
// behind the held records, and tries to send them. done reports that
// nothing is left to send; otherwise the caller finishes with TryFlush when
// the descriptor is writable. Either way the caller then closes the
// descriptor itself (after, if it likes, reading until the peer's EOF with
// TryRead) and calls Close to release the buffers. A write side that
// already failed sends nothing; TryClose twice queues one alert. On a
// connection not in fd mode it does nothing and reports true.
func (c *Conn) TryClose() (done bool) {
	if !c.fdMode.Load() {
		return true
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return true
	}
	if c.werr == nil && !c.closeNotifySent {
		c.queueAlertLocked(c.closingAlert())
	} else if c.unsent != nil {
		_ = c.sendHeldLocked()
	}
	return c.unsent == nil
}

// queueAlertLocked queues alert a behind the held records and tries to
// send it: close_notify ends the write side, any other alert fails it (as
// sendAlertLocked).
func (c *Conn) queueAlertLocked(a alert) {
	level := byte(2) // fatal
	if a == alertCloseNotify || a == alertUserCanceled {
		level = 1 // warning
	}
	c.out.ctrl = [5]byte{level, byte(a)}
	buf, start := c.heldBufLocked(ctrlRecordLen)
	buf, err := c.appendRecordLocked(buf, typeAlert, c.out.ctrl[:2])
	c.holdLocked(buf, start)
	if a == alertCloseNotify {
		c.closeNotifySent = true
	} else if c.werr == nil {
		c.werr = errFailed
	}
	if err == nil {
		_ = c.sendHeldLocked()
	}
}

// heldBufLocked returns the buffer new records (need bytes at most) are
// appended to, and where in it the held records start, for holdLocked: the
// held buffer, whose sent part is dropped (the held records moved to its
// front) only when its tail lacks the room; with nothing held, an empty
// pooled buffer.
func (c *Conn) heldBufLocked(need int) (buf []byte, start int) {
	if c.backlog == nil {
		c.backlog = outBufs.Get().(*[]byte)
		return (*c.backlog)[:0], 0
	}
	b := *c.backlog // the held records are its end
	if cap(b)-len(b) >= need {
		return b, len(b) - len(c.unsent)
	}
	b = b[:cap(b)]
	return b[:copy(b, c.unsent)], 0
}

// holdLocked makes buf[start:], buf from heldBufLocked, the held records.
func (c *Conn) holdLocked(buf []byte, start int) {
	if len(buf) == start {
		c.dropHeldLocked()
		return
	}
	*c.backlog = buf // a buffer that grew goes back to the pool grown
	c.unsent = buf[start:]
}

// dropHeldLocked gives the held buffer back.
func (c *Conn) dropHeldLocked() {
	if c.backlog != nil {
		putOut(c.backlog)
	}
	c.backlog, c.unsent = nil, nil
}

// sendHeldLocked writes as much of the held records as the socket takes. A
// socket error fails the write side and drops them.
func (c *Conn) sendHeldLocked() error {
	n, err := c.writeFDLocked(c.unsent)
	if err != nil {
		c.werr = err
		c.dropHeldLocked()
		return err
	}
	if n == len(c.unsent) {
		c.dropHeldLocked()
		return nil
	}
	c.unsent = c.unsent[n:]
	return nil
}

// writeFDLocked writes buf on the descriptor until it is all written or
// the socket is full; a full socket is not an error.
func (c *Conn) writeFDLocked(buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := syscall.Write(c.fd, buf[n:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return n, nil
		case err != nil:
			return n, os.NewSyscallError("write", err)
		}
		n += k
	}
	return n, nil
}

// closeFD is Close in fd mode: it releases the buffers and leaves the
// descriptor, and any alert, to the caller (TryClose).
func (c *Conn) closeFD() {
	c.rmu.Lock()
	c.releaseReadLocked()
	c.hsMsg = nil
	c.rmu.Unlock()
	c.wmu.Lock()
	c.dropHeldLocked()
	c.wmu.Unlock()
}

// CanUseFD reports whether UseFD would take the connection now: the
// handshake is done, this package (not crypto/tls's fallback) protects the
// data, and the connection is open and not in fd mode yet. A caller that
// gives the socket away before UseFD runs (the engine's StartConn takes it
// out of the runtime's poller first) asks here, so that a refusal costs it
// nothing.
func (c *Conn) CanUseFD() bool {
	return c.hsDone.Load() && !c.fallback && !c.closed.Load() && !c.fdMode.Load()
}
