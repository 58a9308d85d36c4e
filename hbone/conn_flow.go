package hbone

import (
	"sync"

	"golang.org/x/net/http2"
)

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
		c.poll.wakeWin(c.drv.owner())
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
	c.wakeRead(s)
	c.mu.Unlock()
	return nil
}

// setPeerInitialWindowLocked applies the peer's SETTINGS_INITIAL_WINDOW_SIZE:
// every open stream's send window moves by the change (RFC 9113 section
// 6.9.2), and writers of the streams it opens are woken. c.mu held.
func (c *conn) setPeerInitialWindowLocked(v uint32) error {
	delta := int64(v) - c.peerInitialWindow
	c.peerInitialWindow = int64(v)
	for _, st := range c.streams {
		st.sendWindow += delta
		if st.sendWindow > maxWindow {
			return connError(http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE overflows stream %d's window", st.id)
		}
		if delta > 0 {
			st.wakeWriterLocked()
			c.wakeRead(st)
		}
	}
	return nil
}

// waitSendLocked blocks until s and the connection both have send window
// (or s can no longer write), then takes up to want bytes of both windows
// and returns how many. c.mu held; it waits on it.
func (c *conn) waitSendLocked(s *Stream, want int) (int, error) {
	for {
		if err := s.writeErrLocked(); err != nil {
			return 0, err
		}
		if s.sendWindow > 0 && c.sendWindow > 0 {
			break
		}
		if s.sendWindow <= 0 {
			if s.wcond == nil {
				s.wcond = sync.NewCond(&c.mu)
			}
			s.wcond.Wait()
		} else {
			c.connWinWaiters++
			c.connWinCond.Wait()
			c.connWinWaiters--
		}
	}
	m := int(min(int64(want), s.sendWindow, c.sendWindow))
	c.takeSendLocked(s, m)
	return m, nil
}

// takeSendLocked takes n bytes of s's and the connection's send windows
// for DATA about to be queued. c.mu held.
func (c *conn) takeSendLocked(s *Stream, n int) {
	s.sendWindow -= int64(n)
	c.sendWindow -= int64(n)
}

// giveBackSendLocked returns n bytes taken by takeSendLocked that were not
// queued (a deadline or a failure cut the write short, or an event loop's
// read brought less), so that a retry or another stream can use them, and
// wakes whoever waits for the connection window. c.mu held.
func (c *conn) giveBackSendLocked(s *Stream, n int64) {
	s.sendWindow += n
	c.sendWindow += n
	if c.connWinWaiters > 0 {
		c.connWinCond.Broadcast()
	}
	if c.sendWindow == n {
		// It was exhausted: event-loop streams may be waiting for it.
		c.poll.wakeWin(nil)
	}
}

// creditLocked counts n more bytes of s's receive window as consumed and
// returns the increment to send by WINDOW_UPDATE now: 0 until half the
// window is consumed, then all of it, by which the window is raised at once
// (the peer may use it as soon as the frame arrives). s.mu held.
func (s *Stream) creditLocked(n int) (inc int64) {
	s.unacked += int64(n)
	if s.unacked < s.c.streamAckThreshold {
		return 0
	}
	inc, s.unacked = s.unacked, 0
	s.recvWindow += inc
	return inc
}
