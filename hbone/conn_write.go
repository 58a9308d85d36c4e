package hbone

import (
	"fmt"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The write path. Streams and the reader append frames to one shared write
// buffer (c.pending) under c.wmu and commit them; the writer goroutine
// (writeLoop) swaps the buffer out and flushes it with one Write per batch,
// so what is appended while a Write is in progress goes out in the next one.
// An event loop may write a few committed frames itself (commitDirectLocked).

// minDataFrag: a DATA frame is not split to fill less write-buffer space
// than this.
const minDataFrag = 1 << 10

// wbufLocked returns the pending buffer to append frames to. c.wmu held.
func (c *conn) wbufLocked() []byte {
	if c.pending == nil {
		c.pending = getFrameBuf()
	}
	return c.pending.b
}

// commitLocked stores the appended buffer and wakes the writer. c.wmu held.
func (c *conn) commitLocked(b []byte) {
	c.pending.b = b
	if lm := c.loop.Load(); lm != nil {
		// Loop mode: the loop's Flush writes (one Wake until it does).
		if !lm.flushAsked {
			lm.flushAsked = true
			lm.wake()
		}
		return
	}
	if c.writerWaiting {
		c.writerWaiting = false
		c.writerCond.Signal()
	}
}

// commitDirectLocked is commitLocked for an event loop (Stream.WriteFrom):
// when the writer is idle and the frames are few, the loop writes them
// itself if the transport can do so without blocking, so a request or
// response of a few bytes leaves without waking the writer goroutine. The
// writer only idles with nothing in flight, so nothing can overtake these
// frames; c.wmu keeps later appenders behind them. Goroutine callers (the
// reader's WINDOW_UPDATEs, handlers' HEADERS, Stream.Write) keep handing
// their frames to the writer: measured, writing themselves cost the
// connection rate ~10% (the writer's syscalls no longer ran beside the
// reader's work on the other core) for no clear latency gain.
func (c *conn) commitDirectLocked(b []byte) {
	if c.writerWaiting && c.direct != nil && len(b) <= directWriteMax {
		c.pending.b = b
		if c.writeDirectLocked() {
			return
		}
	}
	c.commitLocked(b)
}

// directWriteMax bounds the frames an event loop writes itself: above it,
// sealing and copying would hold the loop (and its other relays) too long,
// and the writer goroutine batches better.
const directWriteMax = 32 << 10

// directWriter is a transport that can take a write without blocking
// (mtls/record.Conn): ok=false means it took nothing; queued means part
// of it waits in the transport for a Flush.
type directWriter interface {
	TryWrite(p []byte) (ok, queued bool, err error)
	Flush() error
}

// writeDirectLocked writes the pending frames through c.direct. It reports
// false when the transport refused or failed; the writer goroutine then
// takes the frames (and meets the same error, ending the connection on its
// path). c.wmu held, the writer idle.
func (c *conn) writeDirectLocked() bool {
	ok, queued, err := c.direct.TryWrite(c.pending.b)
	if !ok || err != nil {
		return false
	}
	c.directWrites++
	// Sent or sealed: the buffer is free, and an idle connection pins none.
	putFrameBuf(c.pending)
	c.pending = nil
	if queued {
		c.flushOwed = true
		c.writerWaiting = false
		c.writerCond.Signal()
	}
	return true
}

func (c *conn) pendingLenLocked() int {
	if c.pending == nil {
		return 0
	}
	return len(c.pending.b)
}

// takePendingLocked takes the committed frames for writing: the spare
// buffer becomes the one appenders fill meanwhile, and whoever waits for
// room in the write buffer is woken (from: as for pollWaiters.wakeBuf).
// Both drivers' writers take the buffer this way. c.wmu held, something
// committed.
func (c *conn) takePendingLocked(from any) *frameBuf {
	out := c.pending
	c.pending, c.spare = c.spare, nil
	if c.bufWaiters > 0 {
		c.bufCond.Signal()
	}
	c.poll.wakeBuf(from)
	return out
}

// recycleLocked keeps a written buffer as the spare (or pools it if there
// is one). c.wmu held.
func (c *conn) recycleLocked(out *frameBuf) {
	out.b = out.b[:0]
	if c.spare == nil {
		c.spare = out
		return
	}
	putFrameBuf(out)
}

// releaseIdleLocked pools the write buffers of a writer with nothing to
// write: an idle connection pins none. c.wmu held.
func (c *conn) releaseIdleLocked() {
	if c.pending != nil {
		putFrameBuf(c.pending)
		c.pending = nil
	}
	if c.spare != nil {
		putFrameBuf(c.spare)
		c.spare = nil
	}
}

// writeLoop flushes the pending buffer with one Write per batch: whatever
// streams append while a Write is in progress goes out in the next one.
func (c *conn) writeLoop() {
	defer c.exit()
	var err error
	c.wmu.Lock()
	for {
		if c.pendingLenLocked() == 0 {
			if c.flushOwed {
				c.flushOwed = false
				c.wmu.Unlock()
				err = c.direct.Flush()
				c.wmu.Lock()
				if err != nil {
					break
				}
				continue
			}
			if c.wclosing {
				break
			}
			c.releaseIdleLocked()
			c.writerWaiting = true
			c.writerCond.Wait()
			c.writerWaiting = false
			continue
		}
		out := c.takePendingLocked(nil)
		// A Write sends what a direct write left held first.
		c.flushOwed = false
		c.wmu.Unlock()
		err = c.write(out.b)
		c.wmu.Lock()
		c.recycleLocked(out)
		if err != nil {
			break
		}
	}
	if err != nil && !c.wclosing {
		c.wclosing = true
		c.wErr = connClosedError(err)
		c.bufCond.Broadcast()
	}
	c.wmu.Unlock()
	if err == nil && c.linger.Load() {
		c.lingerClose()
	}
	if err != nil {
		// The transport's write side failed: nothing, not even a TLS
		// alert, can follow what it cut. The cause is recorded before the
		// close, which would make the reader fail too.
		c.writeFailed.Store(true)
		c.closeWith(fmt.Errorf("hbone: write: %w", err))
	}
	c.closeConn(err != nil)
}

// write sends one batch with one Write (the daemon's mtls/record
// connection seals it and sends it with one syscall).
func (c *conn) write(b []byte) error {
	_, err := c.nc.Write(b)
	return err
}

// queueRSTLocked queues RST_STREAM. c.wmu held.
func (c *conn) queueRSTLocked(id uint32, code http2.ErrCode) {
	if c.wclosing {
		return
	}
	b := c.wbufLocked()
	b = appendRSTStream(b, id, code)
	c.commitLocked(b)
}

// queueControl queues a frame provoked by the peer (a SETTINGS or PING
// acknowledgement) and cuts off a peer that provokes them faster than it
// reads.
func (c *conn) queueControl(ping bool, data [8]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wclosing {
		return nil
	}
	if err := c.backlogErrLocked(); err != nil {
		return err
	}
	b := c.wbufLocked()
	if ping {
		b = appendPing(b, true, data)
	} else {
		b = appendSettingsAck(b)
	}
	c.commitLocked(b)
	return nil
}

// backlogErrLocked cuts off a peer that keeps provoking frames (PING and
// SETTINGS acknowledgements, RST_STREAM, refusals) without reading them:
// they would otherwise pile up in the write buffer without bound. c.wmu
// held.
func (c *conn) backlogErrLocked() error {
	// Streams' DATA may legitimately fill writeBufCap of the buffer; only
	// what lies beyond it was provoked by the peer.
	if n := c.pendingLenLocked(); n > int(c.cfg.MaxControlBacklog)+writeBufCap {
		return connError(http2.ErrCodeEnhanceYourCalm, "%d bytes of frames queued for a peer that does not read them", n)
	}
	return nil
}

// checkBacklog is backlogErrLocked for the reader, after a frame that may
// have queued an answer.
func (c *conn) checkBacklog() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wclosing {
		return nil
	}
	return c.backlogErrLocked()
}

// writeHeadersLocked HPACK-encodes fields and queues them as HEADERS (+
// CONTINUATION). c.wmu held; the caller orders stream creation under c.mu so
// stream IDs go out in increasing order.
func (c *conn) writeHeadersLocked(id uint32, fields []hpack.HeaderField, end bool) error {
	if c.wclosing {
		return c.wErr
	}
	c.hbuf.Reset()
	for _, f := range fields {
		if err := c.enc.WriteField(f); err != nil {
			return err // bytes.Buffer does not fail
		}
	}
	b := c.wbufLocked()
	b = appendHeaderBlock(b, id, end, c.hbuf.Bytes(), c.wPeerMaxFrame)
	c.commitLocked(b)
	return nil
}

// queueErrLocked reports why s may queue no more DATA: the connection's
// writer is closing, or the stream was reset or ended on our side. c.wmu
// held.
func (s *Stream) queueErrLocked() error {
	c := s.c
	switch {
	case c.wclosing:
		return c.wErr
	case s.rstQueued:
		return ErrStreamClosed
	case s.endQueued:
		return ErrWriteAfterClose
	}
	return nil
}

// sendData queues p as DATA frames of s, waiting for write-buffer space. The
// caller holds flow-control credit for all of p. It returns how many bytes it
// queued.
func (c *conn) sendData(s *Stream, p []byte) (sent int, err error) {
	c.wmu.Lock()
	defer func() {
		// Pass the wakeup on while there is room, so waiters are woken one
		// at a time instead of in a herd.
		if c.bufWaiters > 0 && c.pendingLenLocked() < writeBufSize {
			c.bufCond.Signal()
		}
		c.wmu.Unlock()
	}()
	for len(p) > 0 {
		if err := s.queueErrLocked(); err != nil {
			return sent, err
		}
		if s.wdeadlineHit.Load() {
			return sent, deadlineExceeded
		}
		k := min(len(p), c.wPeerMaxFrame)
		if used := c.pendingLenLocked(); used > 0 {
			// Append whole frames up to the soft limit; split one only to
			// fill worthwhile room.
			room := writeBufCap - used - frameHeaderLen
			if used >= writeBufSize || room < min(k, minDataFrag) {
				c.bufWaiters++
				c.bufCond.Wait()
				c.bufWaiters--
				continue
			}
			k = min(k, room)
		}
		b := c.wbufLocked()
		b = appendData(b, s.id, false, p[:k])
		c.commitLocked(b)
		p = p[k:]
		sent += k
	}
	return sent, nil
}
