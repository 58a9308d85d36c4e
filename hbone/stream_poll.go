package hbone

import (
	"fmt"
	"io"
	"math"
	"sync"

	"golang.org/x/net/http2"
)

// This file lets an event loop drive a Stream without a goroutine (the
// engine's StreamEndpoint): non-blocking TryRead and TryWrite, the send
// window the loop may fill, and a Waker the connection's goroutines call
// when either may progress. The blocking Read and Write stay as they are;
// a stream is driven one way or the other, not both.

// Waker is told that a stream's TryRead or TryWrite may make progress. Wake
// must not block; it may be called from any goroutine, with the connection's
// locks held, and spuriously.
type Waker interface {
	Wake()
}

// DirectSink is a Waker that can also take received bytes itself: the
// event loop's relay, which then writes them to its socket from the
// connection's read path instead of being woken to do it (the
// response path of a round trip crosses no goroutine). When a DATA frame's
// payload is already read from the network and the stream has no received
// byte buffered or lent (every earlier byte reached the sink), the read
// path offers the payload to TryDeliver instead of buffering it and waking the
// loop. TryDeliver writes what it can without blocking and returns how
// many bytes it took (0: not now); the stream buffers the rest and wakes
// the sink as usual, so the bytes keep their order. Bytes taken count as
// read: their flow-control window goes back to the peer as with TryRead.
//
// TryDeliver runs with the stream's receive lock held: it must not block
// or call back into the stream. SetWaker takes that lock too, so once
// SetWaker(nil) (or another Waker) has returned no TryDeliver of the old
// sink runs any more, and the sink may close its socket.
type DirectSink interface {
	Waker
	TryDeliver(p []byte) int
}

// wakerRef is a registered Waker and, if it is one, its DirectSink.
type wakerRef struct {
	w    Waker
	sink DirectSink
}

// SetWaker registers w (nil removes it). From then on w.Wake is called when
// data, END_STREAM or a reset arrives, when the send window opens and when
// the connection's write buffer drains after TryWrite or WriteWindow found
// it full. A w that is a DirectSink is also offered received bytes.
func (s *Stream) SetWaker(w Waker) {
	var ref *wakerRef
	if w != nil {
		ref = &wakerRef{w: w}
		ref.sink, _ = w.(DirectSink)
	}
	s.mu.Lock() // the barrier for a TryDeliver in progress (see DirectSink)
	s.waker.Store(ref)
	s.mu.Unlock()
}

func (s *Stream) wake() {
	if ref := s.waker.Load(); ref != nil {
		ref.w.Wake()
	}
}

// wakeOn is wake from inside a driver callback of the connection's event
// loop, o the loop's Owner (nil: not on a loop), which readies a relay of
// its own loop directly (Owner.WakeLocal).
func (s *Stream) wakeOn(o Owner) {
	ref := s.waker.Load()
	switch {
	case ref == nil:
	case o != nil:
		o.WakeLocal(ref.w)
	default:
		ref.w.Wake()
	}
}

// deliverLocked offers p, payload bytes of a DATA frame for s that are in
// the connection's read buffer, to s's DirectSink when s holds no received
// byte, and returns how many the sink took. The read path, s.mu held.
func (s *Stream) deliverLocked(p []byte) int {
	ref := s.waker.Load()
	if ref == nil || ref.sink == nil ||
		s.rbuf.size > 0 || s.peeking || s.filling || s.rerrNow != nil || s.rerrAfter != nil {
		return 0
	}
	return min(max(ref.sink.TryDeliver(p), 0), len(p))
}

// TryRead is Read without blocking: (0, nil) means no data is buffered now
// (wait for Wake). Bytes read return their window to the peer as Read does.
func (s *Stream) TryRead(p []byte) (int, error) {
	s.mu.Lock()
	if s.rerrNow != nil {
		err := s.rerrNow
		s.mu.Unlock()
		return 0, err
	}
	if s.rbuf.size == 0 || len(p) == 0 {
		err := s.rerrAfter
		if s.rbuf.size > 0 {
			err = nil
		}
		s.mu.Unlock()
		return 0, err
	}
	return s.takeLocked(p), nil
}

// Peek is TryRead without the copy: it appends to views (at most
// cap(views) of them) views of the received bytes in the stream's own
// buffer, which stay valid (the connection's read path neither moves nor
// frees them) until Consume; write them with one writev. No
// views with a nil error means no data is buffered now (wait for Wake);
// errors are TryRead's. A Peek that returned views must be followed by a
// Consume, even of 0 bytes, before the next Peek, TryRead, Read or Close.
func (s *Stream) Peek(views [][]byte) ([][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rerrNow != nil {
		return views, s.rerrNow
	}
	if s.rbuf.size == 0 {
		return views, s.rerrAfter
	}
	s.peeking = true
	return s.rbuf.peek(views), nil
}

// Consume ends a Peek: it drops the first n bytes of the views, which
// count as read (their window goes back to the peer as with Read), and
// releases the views.
func (s *Stream) Consume(n int) {
	s.mu.Lock()
	if !s.peeking {
		s.mu.Unlock()
		return
	}
	s.peeking = false
	if s.rerrNow != nil || n <= 0 {
		// A reset discarded the bytes but left the chunks to us.
		if s.rbuf.size == 0 && !s.filling {
			s.rbuf.free()
		}
		s.mu.Unlock()
		return
	}
	s.rbuf.advance(n, s.filling)
	s.ackLocked(n)
}

// TryWrite queues as much of p as the stream and connection send windows
// and the connection's write buffer allow, without blocking, and returns
// how much it took; p may be reused at once. (0, nil) means none fits now
// (wait for Wake). An empty p reports only whether writing has failed:
// a reset, a local close or the connection's end.
func (s *Stream) TryWrite(p []byte) (int, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := s.writeErrLocked(); err != nil {
		return 0, err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := s.queueErrLocked(); err != nil || len(p) == 0 {
		return 0, err
	}
	m := s.windowLocked(len(p))
	if m == 0 {
		return 0, nil
	}
	c.takeSendLocked(s, m)
	b := c.wbufLocked()
	for off := 0; off < m; {
		k := min(m-off, c.wPeerMaxFrame)
		b = appendData(b, s.id, false, p[off:off+k])
		off += k
	}
	c.commitLocked(b)
	return m, nil
}

// WriteWindow reports how many bytes TryWrite would take now, so that a
// loop reads from its socket no more than it can forward. When it is 0 a
// Wake follows once it may not be.
func (s *Stream) WriteWindow() int {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return s.windowLocked(math.MaxInt32)
}

// windowLocked returns min(want, the stream's and the connection's send
// windows, the write buffer's room) and, when that is 0, makes sure a Wake
// follows: a WINDOW_UPDATE for the stream wakes it directly; the connection
// window and the write buffer keep lists of the streams waiting for them.
// c.mu and c.wmu held.
func (s *Stream) windowLocked(want int) int {
	c := s.c
	room := writeBufSize - c.pendingLenLocked()
	if room < minDataFrag && c.pendingLenLocked() > 0 {
		room = 0 // wait for the flush rather than cut tiny frames
	}
	w := min(int64(want), s.sendWindow, c.sendWindow, int64(room))
	if w > 0 {
		return int(w)
	}
	switch {
	case s.sendWindow <= 0:
		// The stream's WINDOW_UPDATE (or a SETTINGS change) wakes it.
	case c.sendWindow <= 0:
		c.poll.wait(s, true)
	default:
		c.poll.wait(s, false)
	}
	return 0
}

// pollWaiters lists the event-loop-driven streams waiting for the
// connection's send window or for room in its write buffer.
type pollWaiters struct {
	mu       sync.Mutex // a leaf: guards the following fields and Stream.inWinWait/inBufWait
	win, buf []*Stream
	spare    []*Stream
}

func (w *pollWaiters) wait(s *Stream, window bool) {
	w.mu.Lock()
	if window && !s.inWinWait {
		s.inWinWait = true
		w.win = append(w.win, s)
	} else if !window && !s.inBufWait {
		s.inBufWait = true
		w.buf = append(w.buf, s)
	}
	w.mu.Unlock()
}

// wakeWin wakes the streams waiting for connection window; called when a
// connection-level WINDOW_UPDATE arrives. from is the event loop's Owner
// when called inside its driver callback (see Stream.wakeOn), else nil.
func (w *pollWaiters) wakeWin(from Owner) { w.wakeAll(true, from) }

// wakeBuf wakes the streams waiting for write-buffer room; called when the
// writer takes the buffer to flush it. from as for wakeWin.
func (w *pollWaiters) wakeBuf(from Owner) { w.wakeAll(false, from) }

func (w *pollWaiters) wakeAll(window bool, from Owner) {
	w.mu.Lock()
	list := &w.buf
	if window {
		list = &w.win
	}
	if len(*list) == 0 {
		w.mu.Unlock()
		return
	}
	ws := *list
	*list, w.spare = w.spare[:0], nil
	for _, s := range ws {
		if window {
			s.inWinWait = false
		} else {
			s.inBufWait = false
		}
	}
	w.mu.Unlock()
	for i, s := range ws {
		s.wakeOn(from)
		ws[i] = nil
	}
	w.mu.Lock()
	if w.spare == nil {
		w.spare = ws[:0]
	}
	w.mu.Unlock()
}

// WriteFrom is TryWrite without the caller's buffer: it calls src.Read once
// with room for at most limit bytes inside the connection's write buffer,
// right behind the header of the DATA frame that will carry them, so the
// bytes read (from a socket, by an event loop) go to the wire with no copy
// in between. src is not read when no byte fits now; then (0, nil, nil)
// means wait for Wake, as with TryWrite. readErr is src's error (then n is
// 0 and nothing is queued); writeErr is the stream's.
//
// src.Read runs with the connection's write lock held: it must not block
// (a non-blocking socket read) and must not call back into the connection.
func (s *Stream) WriteFrom(limit int, src io.Reader) (n int, readErr, writeErr error) {
	c := s.c
	c.mu.Lock()
	if err := s.writeErrLocked(); err != nil {
		c.mu.Unlock()
		return 0, nil, err
	}
	c.wmu.Lock()
	if err := s.queueErrLocked(); err != nil {
		c.wmu.Unlock()
		c.mu.Unlock()
		return 0, nil, err
	}
	m := s.windowLocked(min(limit, c.wPeerMaxFrame)) // registers for a Wake when 0
	b := c.wbufLocked()
	if room := cap(b) - len(b) - frameHeaderLen; m > room {
		// Only a buffer that is nearly full can be short of capacity (its
		// soft limit leaves room for a frame): wait for the flush.
		m = 0
		c.poll.wait(s, false)
	}
	if m <= 0 {
		c.wmu.Unlock()
		c.mu.Unlock()
		return 0, nil, nil
	}
	// The credit is taken before the read, so that c.mu need not be held
	// across it (the read path takes c.mu for every frame it receives); what the read does not use is given back below.
	c.takeSendLocked(s, m)
	c.mu.Unlock()

	start := len(b)
	frame := b[start : start+frameHeaderLen+m]
	k, rerr := src.Read(frame[frameHeaderLen:])
	if k < 0 || k > m {
		k, rerr = 0, fmt.Errorf("hbone: WriteFrom: read returned %d of at most %d bytes", k, m)
	}
	if k > 0 && rerr == nil {
		appendFrameHeader(frame[:0], k, http2.FrameData, 0, s.id)
		c.commitLocked(b[:start+frameHeaderLen+k])
	} else {
		k = 0
	}
	c.wmu.Unlock()
	if unused := int64(m - k); unused > 0 {
		c.mu.Lock()
		c.giveBackSendLocked(s, unused)
		c.mu.Unlock()
	}
	return k, rerr, nil
}
