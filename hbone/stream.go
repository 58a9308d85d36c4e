package hbone

import (
	"context"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

var deadlineExceeded = os.ErrDeadlineExceeded

// Stream is one CONNECT tunnel: a full-duplex byte stream. It is safe for one
// reader and one writer concurrently, plus Close, Reset, CloseWrite and the
// deadline setters from anywhere. It satisfies net.Conn.
type Stream struct {
	// The fields are ordered so that the small ones share words: an idle
	// relayed stream is one of these, and 256 bytes is its size class
	// (TestStreamSizeClass).
	c  *conn
	id uint32

	wdeadlineHit atomic.Bool

	// Guarded by c.mu.
	sendWindow int64
	// wcond is where a blocked Write waits for stream window, made by the
	// first such wait: a stream driven by an event loop never blocks and
	// saves its room (rcond likewise).
	wcond        *sync.Cond
	werr         error
	respDone     chan struct{} // client: closed once the response or a failure is known
	respErr      error
	respFields   []hpack.HeaderField // client: the response's regular fields
	cancel       context.CancelFunc  // server: cancels the handler's context while it runs
	status       uint16              // client: the response's; server: the answer sent (0 before)
	localClosed  bool                // END_STREAM or RST_STREAM sent (or decided)
	remoteClosed bool                // END_STREAM or RST_STREAM received
	reset        bool
	finished     bool // retired from the connection
	appClosed    bool
	respClosed   bool
	inWinWait    bool // queued in c.winWaiters

	// The connection's read path only.
	gotResponse bool

	// Guarded by c.wmu.
	endQueued bool
	rstQueued bool
	inBufWait bool // queued in c.bufWaiters

	// Guarded by mu (below).
	filling      bool // the goroutine driver's reader writes into rbuf's tail outside mu
	peeking      bool // a Peek's view of rbuf's head is in use until Consume
	rdeadlineHit bool

	// waker, if set, is told whenever TryRead or TryWrite may progress
	// (stream_poll.go).
	waker atomic.Pointer[wakerRef]
	// dl holds the deadlines and their timers, made by the first
	// SetDeadline: a relayed stream never has one.
	dl atomic.Pointer[deadlines]

	mu         sync.Mutex // guards the following fields and those marked above
	rcond      *sync.Cond // a blocked Read waits here; see wcond
	rbuf       recvBuffer
	recvWindow int64 // bytes the peer may still send on this stream
	unacked    int64 // read bytes not yet returned by WINDOW_UPDATE
	rerrNow    error // reset or closed: Read fails at once, buffered data is gone
	rerrAfter  error // io.EOF or connection end: Read fails once the buffer is drained
}

// wakeWriterLocked wakes a Write blocked for stream window. c.mu held.
func (s *Stream) wakeWriterLocked() {
	if s.wcond != nil {
		s.wcond.Broadcast()
	}
}

// wakeReaderLocked wakes a blocked Read. s.mu held.
func (s *Stream) wakeReaderLocked() {
	if s.rcond != nil {
		s.rcond.Broadcast()
	}
}

// ID returns the HTTP/2 stream identifier.
func (s *Stream) ID() uint32 { return s.id }

// ResponseHeader returns the headers of the server's 200 response (for
// example baggage) on a client stream, nil on a server stream. The stream
// keeps the fields, not a map (most tunnels never ask): each call builds a
// new Header.
func (s *Stream) ResponseHeader() http.Header {
	if !s.c.client {
		return nil
	}
	return headerFromFields(s.respFields)
}

// LocalAddr returns the local address of the underlying connection.
func (s *Stream) LocalAddr() net.Addr { return s.c.nc.LocalAddr() }

// RemoteAddr returns the remote address of the underlying connection.
func (s *Stream) RemoteAddr() net.Addr { return s.c.nc.RemoteAddr() }

// Read reads tunnelled bytes. It returns io.EOF after the peer's END_STREAM
// and a *StreamError after the peer's RST_STREAM.
func (s *Stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	for {
		if s.rerrNow != nil {
			err := s.rerrNow
			s.mu.Unlock()
			return 0, err
		}
		if s.rdeadlineHit {
			s.mu.Unlock()
			return 0, deadlineExceeded
		}
		if s.rbuf.size > 0 {
			break
		}
		if s.rerrAfter != nil {
			err := s.rerrAfter
			s.mu.Unlock()
			return 0, err
		}
		if len(p) == 0 {
			s.mu.Unlock()
			return 0, nil
		}
		if s.rcond == nil {
			s.rcond = sync.NewCond(&s.mu)
		}
		s.rcond.Wait()
	}
	return s.takeLocked(p), nil
}

// takeLocked moves buffered bytes into p, returns their window to the peer
// (batched) and unlocks s.mu. s.mu held, s.rbuf.size > 0.
func (s *Stream) takeLocked(p []byte) int {
	n := s.rbuf.read(p, s.filling)
	s.ackLocked(n)
	return n
}

// ackLocked returns the window of n bytes read (WINDOW_UPDATEs batched)
// and unlocks s.mu. s.mu held.
func (s *Stream) ackLocked(n int) {
	var inc int64
	if s.rerrAfter == nil {
		inc = s.creditLocked(n)
	}
	s.mu.Unlock()
	s.c.consumed(n)
	if inc > 0 {
		s.c.queueStreamWindowUpdate(s, inc)
	}
}

// Write sends p as DATA, blocking while the stream or connection send window
// is exhausted. Frames are at most the peer's SETTINGS_MAX_FRAME_SIZE. Write
// returns once p is queued for the connection's writer; p may be reused.
func (s *Stream) Write(p []byte) (int, error) {
	c := s.c
	n := 0
	for len(p) > 0 {
		c.mu.Lock()
		m, err := c.waitSendLocked(s, min(len(p), writeBufSize))
		c.mu.Unlock()
		if err != nil {
			return n, err
		}

		sent, err := c.sendData(s, p[:m])
		n += sent
		p = p[sent:]
		if err != nil {
			if unsent := int64(m - sent); unsent > 0 {
				// Give back the credit so a retry after a deadline can use it.
				c.mu.Lock()
				c.giveBackSendLocked(s, unsent)
				c.mu.Unlock()
			}
			return n, err
		}
	}
	return n, nil
}

func (s *Stream) writeErrLocked() error {
	switch {
	case s.werr != nil:
		return s.werr
	case s.localClosed:
		return ErrWriteAfterClose
	case s.wdeadlineHit.Load():
		return deadlineExceeded
	}
	return nil
}

// CloseWrite half-closes the stream: END_STREAM tells the peer no more data
// follows (its Read returns io.EOF) while this side can still read.
func (s *Stream) CloseWrite() error {
	c := s.c
	c.mu.Lock()
	if s.werr != nil {
		err := s.werr
		c.mu.Unlock()
		return err
	}
	if s.localClosed {
		c.mu.Unlock()
		return nil
	}
	c.wmu.Lock()
	if c.wclosing {
		err := c.wErr
		c.wmu.Unlock()
		c.mu.Unlock()
		return err
	}
	if !s.endQueued && !s.rstQueued {
		s.endQueued = true
		b := c.wbufLocked()
		b = appendData(b, s.id, true, nil)
		c.commitLocked(b)
	}
	c.wmu.Unlock()
	s.localClosed = true
	s.wakeWriterLocked()
	c.maybeFinishLocked(s)
	c.unlock()
	return nil
}

// Reset aborts the stream with RST_STREAM(code); Read and Write fail with
// ErrStreamClosed afterwards.
func (s *Stream) Reset(code http2.ErrCode) error {
	c := s.c
	c.mu.Lock()
	c.resetLocked(s, code, ErrStreamClosed, true)
	c.unlock()
	s.abortRecv(ErrStreamClosed)
	return nil
}

// Close releases the stream. If both directions already ended cleanly
// (END_STREAM sent and received) nothing is sent; otherwise the stream is
// reset with CANCEL. Unread data is dropped. Close is idempotent.
func (s *Stream) Close() error {
	c := s.c
	c.mu.Lock()
	if s.appClosed {
		c.mu.Unlock()
		return nil
	}
	s.appClosed = true
	clean := s.localClosed && s.remoteClosed
	c.resetLocked(s, http2.ErrCodeCancel, ErrStreamClosed, !clean)
	c.unlock()
	s.abortRecv(ErrStreamClosed)
	s.mu.Lock()
	if d := s.dl.Load(); d != nil && d.rtimer != nil {
		d.rtimer.Stop()
	}
	s.mu.Unlock()
	if d := s.dl.Load(); d != nil {
		d.wmu.Lock()
		if d.wtimer != nil {
			d.wtimer.Stop()
		}
		d.wmu.Unlock()
	}
	return nil
}

// abortRecv fails the read side at once with err and drops buffered data,
// returning its connection window.
func (s *Stream) abortRecv(err error) {
	s.mu.Lock()
	if s.rerrNow == nil {
		s.rerrNow = err
	}
	n := s.rbuf.discard(s.filling || s.peeking)
	s.wakeReaderLocked()
	s.mu.Unlock()
	s.c.consumed(n)
	s.wake()
}

// endRecv ends the read side with err once buffered data has been read.
func (s *Stream) endRecv(err error) {
	s.mu.Lock()
	if s.rerrAfter == nil {
		s.rerrAfter = err
	}
	s.wakeReaderLocked()
	s.mu.Unlock()
	s.wake()
}

// deadlines are a stream's read and write deadlines and their timers.
type deadlines struct {
	r      time.Time   // guarded by Stream.mu
	rtimer *time.Timer // guarded by Stream.mu
	wmu    sync.Mutex  // guards w and wtimer
	w      time.Time
	wtimer *time.Timer
}

// deadlines returns s.dl, made on first use.
func (s *Stream) deadlines() *deadlines {
	if d := s.dl.Load(); d != nil {
		return d
	}
	s.dl.CompareAndSwap(nil, &deadlines{})
	return s.dl.Load()
}

// SetDeadline sets the read and write deadlines.
func (s *Stream) SetDeadline(t time.Time) error {
	_ = s.SetReadDeadline(t)
	return s.SetWriteDeadline(t)
}

// SetReadDeadline makes pending and future Reads fail with
// os.ErrDeadlineExceeded after t; the zero time means no deadline.
func (s *Stream) SetReadDeadline(t time.Time) error {
	if t.IsZero() && s.dl.Load() == nil {
		s.mu.Lock()
		s.rdeadlineHit = false
		s.mu.Unlock()
		return nil // no deadline was ever set: nothing to make
	}
	d := s.deadlines()
	s.mu.Lock()
	defer s.mu.Unlock()
	d.r = t
	s.rdeadlineHit = false
	if d.rtimer != nil {
		d.rtimer.Stop()
	}
	if t.IsZero() {
		return nil
	}
	wait := time.Until(t)
	if wait <= 0 {
		s.rdeadlineHit = true
		s.wakeReaderLocked()
		return nil
	}
	if d.rtimer == nil {
		d.rtimer = time.AfterFunc(wait, s.onReadDeadline)
	} else {
		d.rtimer.Reset(wait)
	}
	return nil
}

func (s *Stream) onReadDeadline() {
	s.mu.Lock()
	if d := s.dl.Load(); !d.r.IsZero() && !time.Now().Before(d.r) {
		s.rdeadlineHit = true
		s.wakeReaderLocked()
	}
	s.mu.Unlock()
}

// SetWriteDeadline makes pending and future Writes fail with
// os.ErrDeadlineExceeded after t; the zero time means no deadline. A Write
// that times out may have queued part of its data.
func (s *Stream) SetWriteDeadline(t time.Time) error {
	if t.IsZero() && s.dl.Load() == nil {
		s.wdeadlineHit.Store(false)
		return nil // no deadline was ever set: nothing to make
	}
	d := s.deadlines()
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.w = t
	s.wdeadlineHit.Store(false)
	if d.wtimer != nil {
		d.wtimer.Stop()
	}
	if t.IsZero() {
		return nil
	}
	wait := time.Until(t)
	if wait <= 0 {
		s.wdeadlineHit.Store(true)
		s.wakeWriter()
		return nil
	}
	if d.wtimer == nil {
		d.wtimer = time.AfterFunc(wait, s.onWriteDeadline)
	} else {
		d.wtimer.Reset(wait)
	}
	return nil
}

func (s *Stream) onWriteDeadline() {
	d := s.dl.Load()
	d.wmu.Lock()
	hit := !d.w.IsZero() && !time.Now().Before(d.w)
	if hit {
		s.wdeadlineHit.Store(true)
	}
	d.wmu.Unlock()
	if hit {
		s.wakeWriter()
	}
}

// wakeWriter wakes the stream's writer wherever it waits so it sees a
// deadline.
func (s *Stream) wakeWriter() {
	c := s.c
	c.mu.Lock()
	s.wakeWriterLocked()
	c.connWinCond.Broadcast()
	c.mu.Unlock()
	c.wmu.Lock()
	c.bufCond.Broadcast()
	c.wmu.Unlock()
}

var _ net.Conn = (*Stream)(nil)
