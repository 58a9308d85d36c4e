package record

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
)

const (
	// writeBatch is how many full records one output buffer holds: a Write
	// of up to writeBatch*maxPlaintext bytes (256 KiB) leaves in one write
	// system call; a longer one in one per batch.
	writeBatch = 16
	// ctrlRecordLen bounds the wire size of an alert or KeyUpdate record.
	ctrlRecordLen = 32
	outBufSize    = writeBatch*sealedLen + 2*ctrlRecordLen
)

// rekeyAfter is how many records one write key protects before Write sends
// a KeyUpdate on its own: AES-GCM's confidentiality margin (RFC 8446
// section 5.5 allows about 2^24.5 full records). A variable so that tests
// can lower it.
var rekeyAfter uint64 = 1 << 24

// outBufs holds the output buffers between Writes, so an idle connection
// pins none.
var outBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, outBufSize)
	return &b
}}

// Write seals p into records of up to 16 KiB laid back to back in one
// buffer and writes them with one call on the underlying connection (one
// per 256 KiB). A failed or timed-out write fails every later Write.
func (c *Conn) Write(p []byte) (int, error) {
	return c.write(p, false)
}

// WriteLent is Write for a caller that lends p's memory for the call, as
// TryWriteLent: each record is sealed straight from p, its type byte put
// for the seal into the byte of p after its content (or after p, within
// cap(p)) and restored, so p's bytes change during the call and are as
// they were when it returns. Nothing else may read or write that memory
// meanwhile.
func (c *Conn) WriteLent(p []byte) (int, error) {
	return c.write(p, true)
}

// write is Write and, with lent, WriteLent.
func (c *Conn) write(p []byte, lent bool) (int, error) {
	own, err := c.ownRecords()
	if err != nil {
		return 0, err
	}
	if !own {
		return c.tc.Write(p)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.fdMode.Load() {
		return 0, ErrFDMode
	}
	if err := c.writableLocked(); err != nil {
		return 0, err
	}
	ob := outBufs.Get().(*[]byte)
	defer putOut(ob)
	written := 0
	for {
		buf, queued, err := c.sealLocked((*ob)[:0], p[written:], lent)
		if err != nil {
			return written, err
		}
		if err := c.flushLocked(buf); err != nil {
			return written, err
		}
		written += queued
		if written == len(p) {
			return written, nil
		}
	}
}

// sealLocked appends to buf the records carrying as much of p as buf's
// capacity takes, after any KeyUpdate that is due, and reports how many
// bytes of p they carry. With lent (TryWriteLent), a record whose content
// has a byte of p's capacity after it is sealed straight from p
// (sealFromLocked); any other is copied into buf first.
func (c *Conn) sealLocked(buf, p []byte, lent bool) ([]byte, int, error) {
	var err error
	if c.pendingKeyUpdate.Swap(false) {
		if buf, err = c.appendKeyUpdateLocked(buf, false); err != nil {
			return buf, 0, err
		}
	}
	queued := 0
	for queued < len(p) && cap(buf)-len(buf) >= sealedLen+ctrlRecordLen {
		if c.out.seq >= rekeyAfter {
			if buf, err = c.appendKeyUpdateLocked(buf, false); err != nil {
				return buf, queued, err
			}
		}
		k := min(len(p)-queued, maxPlaintext)
		if lent && queued+k < cap(p) {
			buf, err = c.sealFromLocked(buf, p[queued:queued+k+1])
		} else {
			buf, err = c.appendRecordLocked(buf, typeApplicationData, p[queued:queued+k])
		}
		if err != nil {
			return buf, queued, err
		}
		queued += k
	}
	return buf, queued, nil
}

// sealAllLocked is sealLocked for all of p (at most MaxTryWrite bytes): in
// the rare batch where KeyUpdates take the room of the last record (one
// the peer asked for and one rekeyAfter makes due), buf grows for it.
func (c *Conn) sealAllLocked(buf, p []byte, lent bool) ([]byte, error) {
	for {
		var queued int
		var err error
		buf, queued, err = c.sealLocked(buf, p, lent)
		if err != nil || queued == len(p) {
			return buf, err
		}
		p = p[queued:]
		buf = slices.Grow(buf, sealedLen+ctrlRecordLen)
	}
}

// MaxTryWrite is the most a TryWrite takes: what one output buffer holds.
const MaxTryWrite = writeBatch * maxPlaintext

// TryWrite writes p if it can do so without waiting, for a caller that must
// not block (an event loop) and would otherwise hand p to a goroutine that
// may. It returns ok=false, having written nothing, when that is not
// possible: another write holds the connection, crypto/tls keeps the data,
// the underlying connection has no file descriptor, p is longer than
// MaxTryWrite, or the handshake has not completed. With ok=true all of p is
// sealed: the socket took the records, or queued reports that the rest is
// held in the connection, to go out before anything else on the next Write
// or Flush, which the caller must then arrange.
//
// In fd mode (UseFD) TryWrite writes on the descriptor, the KeyUpdate the
// peer asked for first, and does not refuse while records are held: it
// seals p behind them (ok=true, queued=true), as long as the held records
// stay within one output buffer (about MaxTryWrite bytes of content). Past
// that bound it takes nothing and reports ok=false, queued=true: the caller
// waits until the descriptor is writable, calls TryFlush, and tries again;
// that is the back-pressure. It never holds more than one buffer. A fatal
// alert the reader owes the peer is queued instead of p, and TryWrite
// returns the write side's error.
func (c *Conn) TryWrite(p []byte) (ok, queued bool, err error) {
	return c.tryWrite(p, false)
}

// TryWriteLent is TryWrite for a caller that lends p's memory for the
// duration of the call: each record is sealed straight from p into the
// output buffer, without TryWrite's copy of the content, by putting the
// record's content-type byte (which the sealed plaintext needs right after
// the content) into the byte of p that follows the content, and restoring
// that byte after the seal. So p's bytes, and the byte after p when cap(p)
// allows, change during the call; all are as they were when it returns.
// Nothing else may read or write that memory meanwhile. A last record
// without a byte of capacity after it is copied, as TryWrite does.
func (c *Conn) TryWriteLent(p []byte) (ok, queued bool, err error) {
	return c.tryWrite(p, true)
}

// tryWrite is TryWrite and, with lent, TryWriteLent.
func (c *Conn) tryWrite(p []byte, lent bool) (ok, queued bool, err error) {
	if c.fdMode.Load() {
		if len(p) > MaxTryWrite {
			return false, false, nil
		}
		c.wmu.Lock()
		defer c.wmu.Unlock()
		return c.tryWriteFDLocked(p, lent)
	}
	if !c.hsDone.Load() || c.fallback || c.rc == nil || len(p) > MaxTryWrite {
		return false, false, nil
	}
	if !c.wmu.TryLock() {
		return false, false, nil
	}
	defer c.wmu.Unlock()
	if c.unsent != nil || c.pendingAlert.Load() != 0 {
		// Held records go first, and an alert the reader owes the peer
		// too: either may need waiting for.
		return false, false, nil
	}
	if err := c.writableLocked(); err != nil {
		return true, false, err
	}
	ob := outBufs.Get().(*[]byte)
	buf, err := c.sealAllLocked((*ob)[:0], p, lent)
	if err != nil {
		putOut(ob)
		return true, false, err
	}
	n, err := c.writeNowLocked(buf)
	if err != nil {
		putOut(ob)
		c.werr = err
		return true, false, err
	}
	if n == len(buf) {
		putOut(ob)
		return true, false, nil
	}
	*ob = buf
	c.backlog, c.unsent = ob, buf[n:]
	return true, true, nil
}

// writeNowLocked makes one non-blocking write attempt of buf on the socket.
// A full socket buffer is not an error: it returns what was written.
func (c *Conn) writeNowLocked(buf []byte) (int, error) {
	if c.writeNowFn == nil {
		c.writeNowFn = c.writeNow // one closure per connection, not per write
	}
	c.now = nowWrite{buf: buf}
	err := c.rc.Write(c.writeNowFn)
	n, werr := c.now.n, c.now.err
	c.now = nowWrite{}
	if werr != nil {
		return n, werr
	}
	return n, err
}

// nowWrite is one writeNow attempt: its input and results.
type nowWrite struct {
	buf []byte
	n   int
	err error
}

// writeNow is the syscall.RawConn callback of writeNowLocked. c.wmu held.
func (c *Conn) writeNow(fd uintptr) bool {
	for {
		k, err := syscall.Write(int(fd), c.now.buf)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
		case err != nil:
			c.now.err = os.NewSyscallError("write", err)
		default:
			c.now.n = k
		}
		return true // never wait: the caller's thread must not block
	}
}

// Flush sends the records a TryWrite left held, waiting as a Write does.
func (c *Conn) Flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.fdMode.Load() {
		return ErrFDMode
	}
	if c.werr != nil {
		return c.werr
	}
	return c.flushLocked(nil)
}

func putOut(ob *[]byte) {
	*ob = (*ob)[:0]
	outBufs.Put(ob)
}

// KeyUpdate sends a KeyUpdate and moves the write keys on (RFC 8446
// section 4.6.3). With requestPeer, the peer is asked to move its keys too.
// It is unsupported when crypto/tls keeps the connection's data.
func (c *Conn) KeyUpdate(requestPeer bool) error {
	own, err := c.ownRecords()
	if err != nil {
		return err
	}
	if !own {
		return fmt.Errorf("record: KeyUpdate on a connection crypto/tls protects: %w", errors.ErrUnsupported)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.fdMode.Load() {
		return ErrFDMode
	}
	if err := c.writableLocked(); err != nil {
		return err
	}
	ob := outBufs.Get().(*[]byte)
	defer putOut(ob)
	// Our KeyUpdate also answers one the peer requested.
	c.pendingKeyUpdate.Store(false)
	buf, err := c.appendKeyUpdateLocked((*ob)[:0], requestPeer)
	if err != nil {
		return err
	}
	return c.flushLocked(buf)
}

// writableLocked reports why nothing more may be written, if so. A read
// side that failed with a protocol error sends its alert here (in fd mode
// queues it, for TryFlush: nothing may wait there) and fails the write
// side too.
func (c *Conn) writableLocked() error {
	if c.werr != nil {
		return c.werr
	}
	if c.closeNotifySent {
		return errShutdown
	}
	if c.closed.Load() {
		return net.ErrClosed
	}
	if c.pendingAlert.Load() != 0 {
		if c.fdMode.Load() {
			c.queueAlertLocked(c.closingAlert())
		} else {
			_ = c.sendAlertLocked(c.closingAlert())
		}
		return c.werr
	}
	return nil
}

// appendRecordLocked appends one protected record of content type typ
// carrying content (at most maxPlaintext bytes). The content is copied
// behind the header and sealed in place: the inner plaintext needs the type
// byte after the content, which the caller's slice cannot take, and the
// copy leaves the record in the L1 cache for the seal.
func (c *Conn) appendRecordLocked(buf []byte, typ byte, content []byte) ([]byte, error) {
	nonce, err := c.out.nextNonce()
	if err != nil {
		c.werr = err
		return buf, err
	}
	start := len(buf)
	clen := len(content) + 1 + tagLen
	buf = slices.Grow(buf, headerLen+clen) // no-op for the pooled buffers
	c.out.aad = [headerLen]byte{typeApplicationData, 3, 3, byte(clen >> 8), byte(clen)}
	buf = append(buf, c.out.aad[:]...)
	buf = append(buf, content...)
	buf = append(buf, typ)
	pt := buf[start+headerLen:]
	sealed := c.out.aead.Seal(pt[:0], nonce, pt, c.out.aad[:])
	return buf[:start+headerLen+len(sealed)], nil
}

// sealFromLocked appends one application-data record carrying pt[:len(pt)-1]
// sealed straight from pt, without the copy appendRecordLocked makes: the
// inner plaintext's type byte goes into pt's last byte for the seal, which
// reads pt and writes the ciphertext behind the header in buf, and the
// byte is restored. The caller lends pt (TryWriteLent).
func (c *Conn) sealFromLocked(buf, pt []byte) ([]byte, error) {
	nonce, err := c.out.nextNonce()
	if err != nil {
		c.werr = err
		return buf, err
	}
	start := len(buf)
	clen := len(pt) + tagLen               // the content, its type byte, the tag
	buf = slices.Grow(buf, headerLen+clen) // no-op for the pooled buffers
	c.out.aad = [headerLen]byte{typeApplicationData, 3, 3, byte(clen >> 8), byte(clen)}
	buf = append(buf, c.out.aad[:]...)
	last := len(pt) - 1
	saved := pt[last]
	pt[last] = typeApplicationData
	sealed := c.out.aead.Seal(buf[len(buf):], nonce, pt, c.out.aad[:])
	pt[last] = saved
	return buf[:start+headerLen+len(sealed)], nil
}

// appendKeyUpdateLocked appends a KeyUpdate record and moves the write
// keys on: the records after it in buf are sealed with the next keys.
func (c *Conn) appendKeyUpdateLocked(buf []byte, requestPeer bool) ([]byte, error) {
	req := byte(0)
	if requestPeer {
		req = 1
	}
	c.out.ctrl = [5]byte{hsKeyUpdate, 0, 0, 1, req}
	buf, err := c.appendRecordLocked(buf, typeHandshake, c.out.ctrl[:5])
	if err != nil {
		return buf, err
	}
	if err := c.out.update(); err != nil {
		c.werr = err
		return buf, err
	}
	return buf, nil
}

// sendAlertLocked sends alert a: close_notify ends the write side, any
// other alert fails it.
func (c *Conn) sendAlertLocked(a alert) error {
	level := byte(2) // fatal
	if a == alertCloseNotify || a == alertUserCanceled {
		level = 1 // warning
	}
	ob := outBufs.Get().(*[]byte)
	defer putOut(ob)
	c.out.ctrl = [5]byte{level, byte(a)}
	buf, err := c.appendRecordLocked((*ob)[:0], typeAlert, c.out.ctrl[:2])
	if err == nil {
		err = c.flushLocked(buf)
	}
	if a == alertCloseNotify {
		c.closeNotifySent = true
	} else if c.werr == nil {
		c.werr = errFailed
	}
	return err
}

// flushLocked writes the records a TryWrite left held, then buf, looping
// on short writes. Any error is final: a record may have been cut.
func (c *Conn) flushLocked(buf []byte) error {
	if c.unsent != nil {
		err := c.writeAllLocked(c.unsent)
		putOut(c.backlog)
		c.backlog, c.unsent = nil, nil
		if err != nil {
			return err
		}
	}
	return c.writeAllLocked(buf)
}

func (c *Conn) writeAllLocked(buf []byte) error {
	for len(buf) > 0 {
		n, err := c.raw.Write(buf)
		buf = buf[n:]
		if err != nil {
			c.werr = err
			return err
		}
	}
	return nil
}
