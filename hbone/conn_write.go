package hbone

import (
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The write path. Streams and the read path append frames to one shared
// write buffer (c.pending) under c.wmu and commit them (commitLocked); the
// driver's writer takes the buffer (takePendingLocked), writes it while
// appenders fill the spare, and gives it back as the next spare
// (recycleLocked), so what is appended while a write is in progress goes
// out with the next one.

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
func (c *conn) takePendingLocked(from Owner) *frameBuf {
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

// failWritesLocked closes the write side after the transport's write
// failed with err: appenders get the error from now on. c.wmu held.
func (c *conn) failWritesLocked(err error) {
	if !c.wclosing {
		c.wclosing = true
		c.wErr = connClosedError(err)
		c.bufCond.Broadcast()
	}
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

// checkBacklog is backlogErrLocked for the read path, after a frame that may
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
