package hbone

import "golang.org/x/net/http2"

// The stream table: what a connection may open, and how a stream leaves it
// (finished on the wire, reset by either side). c.mu guards all of it.

func (c *conn) newStream(id uint32) *Stream {
	s := &Stream{c: c, id: id, recvWindow: int64(c.cfg.StreamWindow)}
	return s
}

// streamLimitLocked is how many streams this client may have open.
func (c *conn) streamLimitLocked() int {
	return int(min(c.cfg.MaxStreams, c.peerMaxStreams))
}

func (c *conn) canTakeLocked() bool {
	return c.newStreamErrLocked() == nil && c.active+c.reserved < c.streamLimitLocked()
}

// newStreamErrLocked reports why the connection takes no new streams at all.
func (c *conn) newStreamErrLocked() error {
	switch {
	case c.closed:
		return connClosedError(c.closeErr)
	case c.goAwayRecv || c.goAwaySent || c.nextID > maxStreamID:
		return ErrGoingAway
	}
	return nil
}

// idleLocked reports whether id names a stream that was never opened.
func (c *conn) idleLocked(id uint32) bool {
	if id%2 == 0 {
		return true // neither side opens even (server-initiated) streams
	}
	if c.client {
		return id >= c.nextID
	}
	return id > c.maxPeerID
}

func (c *conn) lastPeerIDLocked() uint32 {
	if c.client {
		return 0
	}
	return c.maxPeerID
}

// finishLocked retires a stream that is closed on the wire.
func (c *conn) finishLocked(s *Stream) {
	if s.finished {
		return
	}
	s.finished = true
	if c.streams[s.id] == s {
		delete(c.streams, s.id)
		c.active--
	}
	if s.cancel != nil {
		s.cancel()
	}
	c.slotFreedLocked()
}

// maybeFinishLocked retires s once END_STREAM went both ways.
func (c *conn) maybeFinishLocked(s *Stream) {
	if s.localClosed && s.remoteClosed {
		c.finishLocked(s)
		c.noteClosedLocked(s.id, closedPeerEnded)
	}
}

// slotFreedLocked runs when a stream or reservation ends: a draining
// connection closes once empty, a pooled one starts its idle clock.
func (c *conn) slotFreedLocked() {
	if c.closed || c.active+c.reserved > 0 {
		return
	}
	if c.goAwaySent || c.goAwayRecv || c.nextID > maxStreamID {
		c.drainNow = true
		return
	}
	c.startIdleLocked()
}

// unlock releases c.mu and closes the connection if it just drained.
func (c *conn) unlock() {
	drain := c.drainNow
	c.drainNow = false
	c.mu.Unlock()
	if drain {
		c.shutdown(errDrained, false, 0, "", true)
	}
}

// resetLocked closes s because of a reset: RST_STREAM(code) is queued if
// sendRST and the stream is still open on the wire; werr is what the
// stream's writer (and a waiting Connect) gets.
func (c *conn) resetLocked(s *Stream, code http2.ErrCode, werr error, sendRST bool) {
	if s.reset {
		return
	}
	var how closedHow // for the history of a server stream
	if s.remoteClosed {
		how = closedPeerEnded // not by a reset: s.reset is false
	}
	if sendRST && !(s.localClosed && s.remoteClosed) && !c.closed {
		c.wmu.Lock()
		if !s.rstQueued {
			s.rstQueued = true
			c.queueRSTLocked(s.id, code)
			if c.bufWaiters > 0 {
				c.bufCond.Broadcast() // this stream's writer may wait for space
			}
		}
		c.wmu.Unlock()
		how |= closedLocalReset
	}
	s.reset = true
	s.localClosed, s.remoteClosed = true, true
	if s.werr == nil {
		s.werr = werr
	}
	s.wakeWriterLocked()
	if c.connWinWaiters > 0 {
		c.connWinCond.Broadcast()
	}
	c.closeRespLocked(s, werr)
	c.finishLocked(s)
	c.noteClosedLocked(s.id, how)
}

// closeRespLocked ends a client stream's wait for its response.
func (c *conn) closeRespLocked(s *Stream, err error) {
	if s.respDone != nil && !s.respClosed {
		s.respClosed = true
		s.respErr = err
		close(s.respDone)
		s.respDone = nil // Connect holds its own reference; an idle stream none
	}
}

// streamError resets s because the peer broke a stream-level rule.
func (c *conn) streamError(s *Stream, code http2.ErrCode) {
	err := &StreamError{Code: code, Local: true}
	c.mu.Lock()
	c.resetLocked(s, code, err, true)
	c.unlock()
	s.abortRecv(err)
}
