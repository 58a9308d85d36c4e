package hbone

import "golang.org/x/net/http2"

// Flow control (RFC 9113 section 5.2), both directions.
//
// Send side: the connection's and each stream's send windows (c.sendWindow,
// Stream.sendWindow, under c.mu) are taken before DATA is queued and given
// back when it is not sent; the peer's WINDOW_UPDATEs and its
// SETTINGS_INITIAL_WINDOW_SIZE move them. Blocking writers wait on the
// stream's wcond or on c.connWinCond; event-loop streams register in c.poll.
//
// Receive side: the connection's window is atomic (stream readers return
// credit from their own goroutines), each stream's is under Stream.mu.
// Consumed bytes go back by WINDOW_UPDATE once half a window is consumed.

// consumed returns n bytes of connection window: read by a stream, discarded,
// or padding. WINDOW_UPDATE goes out once half the window is consumed.
func (c *conn) consumed(n int) {
	if n <= 0 || c.connUnacked.Add(int64(n)) < c.connAckThreshold {
		return
	}
	v := c.connUnacked.Swap(0)
	if v <= 0 {
		return
	}
	// Credit before the frame can reach the peer.
	c.recvConnAvail.Add(v)
	c.wmu.Lock()
	if !c.wclosing {
		b := c.wbufLocked()
		b = appendWindowUpdate(b, 0, uint32(v))
		c.commitLocked(b)
	}
	c.wmu.Unlock()
}

// queueStreamWindowUpdate returns inc bytes of s's window to the peer.
func (c *conn) queueStreamWindowUpdate(s *Stream, inc int64) {
	c.wmu.Lock()
	if !c.wclosing && !s.rstQueued {
		b := c.wbufLocked()
		b = appendWindowUpdate(b, s.id, uint32(inc))
		c.commitLocked(b)
	}
	c.wmu.Unlock()
}
func (c *conn) handleWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	c.mu.Lock()
	if f.StreamID == 0 {
		c.sendWindow += inc
		if c.sendWindow > maxWindow {
			c.mu.Unlock()
			return connError(http2.ErrCodeFlowControl, "connection send window overflow")
		}
		if c.connWinWaiters > 0 {
			c.connWinCond.Broadcast()
		}
		c.poll.wakeWin()
		c.mu.Unlock()
		return nil
	}
	s := c.streams[f.StreamID]
	if s == nil {
		idle := c.idleLocked(f.StreamID) || c.skippedLocked(f.StreamID)
		c.mu.Unlock()
		if idle {
			return connError(http2.ErrCodeProtocol, "WINDOW_UPDATE on idle stream %d", f.StreamID)
		}
		// RFC 9113 section 5.1: WINDOW_UPDATE may follow our END_STREAM
		// or RST_STREAM.
		return nil
	}
	s.sendWindow += inc
	if s.sendWindow > maxWindow {
		c.mu.Unlock()
		c.streamError(s, http2.ErrCodeFlowControl)
		return c.spendReset()
	}
	s.wakeWriterLocked()
	s.wake()
	c.mu.Unlock()
	return nil
}
