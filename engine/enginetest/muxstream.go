package enginetest

import (
	"errors"
	"io"
	"net"

	"github.com/ztunnel-go/ztunnel/engine"
)

// MuxStream is one stream of a Mux: an engine.StreamEndpoint (and Homed),
// relayed by the loop or, on the fallback, by goroutines through its
// blocking Read and Write.
type MuxStream struct {
	m  *Mux
	id uint32

	// Guarded by m.mu.
	waker   engine.Waker
	rbuf    []byte // received, unread: at most MuxWindow bytes
	rerr    error  // reported once rbuf is drained
	werr    error  // writing fails from now on
	credit  int    // send window the peer granted
	unacked int    // consumed bytes not yet credited back
	wclosed bool   // FIN sent
	closed  bool   // Close or Abort was called
	owed    bool   // a write found no room: Wake when it opens
}

// wakeLocked tells the relay (and blocked Read/Write calls) to look again:
// from inside the loop's driver callbacks by the handle's WakeLocal, which
// readies a relay of the same loop with no task.
func (s *MuxStream) wakeLocked() {
	s.m.cond.Broadcast()
	if s.waker == nil {
		return
	}
	if s.m.local {
		s.m.h.WakeLocal(s.waker)
		return
	}
	s.waker.Wake()
}

// consumedLocked notes n bytes read by the relay and returns window to
// the peer once a quarter of it is owed.
func (s *MuxStream) consumedLocked(n int) {
	s.unacked += n
	if s.unacked >= MuxWindow/4 || (n > 0 && len(s.rbuf) == 0) {
		if s.m.err == nil && !s.closed {
			s.m.commitLocked(appendCredit(s.m.wq, s.id, s.unacked))
		}
		s.unacked = 0
	}
}

// Home implements engine.Homed.
func (s *MuxStream) Home() *engine.ConnHandle {
	if s.m.noHome {
		return nil
	}
	return s.m.h
}

// SetWaker implements engine.StreamEndpoint.
func (s *MuxStream) SetWaker(w engine.Waker) {
	s.m.mu.Lock()
	s.waker = w
	s.m.mu.Unlock()
}

// TryRead implements engine.StreamEndpoint.
func (s *MuxStream) TryRead(p []byte) (int, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	return s.tryReadLocked(p)
}

func (s *MuxStream) tryReadLocked(p []byte) (int, error) {
	if s.closed {
		return 0, net.ErrClosed
	}
	if len(s.rbuf) == 0 {
		return 0, s.rerr
	}
	n := copy(p, s.rbuf)
	s.rbuf = s.rbuf[:copy(s.rbuf, s.rbuf[n:])]
	s.consumedLocked(n)
	return n, nil
}

func (s *MuxStream) writeErrLocked() error {
	switch {
	case s.werr != nil:
		return s.werr
	case s.closed:
		return net.ErrClosed
	case s.wclosed:
		return errors.New("enginetest: write after CloseWrite")
	}
	return nil
}

func (s *MuxStream) roomLocked() int {
	return max(min(s.credit, muxMaxFrame, muxMaxQueued-s.m.queued), 0)
}

// TryWrite implements engine.StreamEndpoint.
func (s *MuxStream) TryWrite(p []byte) (int, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if err := s.writeErrLocked(); err != nil {
		return 0, err
	}
	n := min(len(p), s.roomLocked())
	if n == 0 {
		if len(p) > 0 {
			s.oweLocked()
		}
		return 0, nil
	}
	s.credit -= n
	s.m.commitLocked(appendFrame(s.m.wq, muxData, s.id, p[:n]))
	return n, nil
}

// WriteWindow implements engine.StreamEndpoint.
func (s *MuxStream) WriteWindow() int {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.writeErrLocked() != nil {
		return 0
	}
	n := s.roomLocked()
	if n == 0 {
		s.oweLocked()
	}
	return n
}

// oweLocked notes a write that found no room: a Wake is owed when the
// window or the write queue opens.
func (s *MuxStream) oweLocked() {
	s.owed = true
	if s.m.queued >= muxMaxQueued {
		s.m.qOwed = true
	}
}

// Read is the blocking form, for the goroutine relay.
func (s *MuxStream) Read(p []byte) (int, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	for len(s.rbuf) == 0 && s.rerr == nil && !s.closed {
		s.m.cond.Wait()
	}
	return s.tryReadLocked(p)
}

// Write is the blocking form, for the goroutine relay.
func (s *MuxStream) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		n, err := s.TryWrite(p)
		total += n
		p = p[n:]
		if err != nil {
			return total, err
		}
		if n == 0 {
			s.m.mu.Lock()
			for s.writeErrLocked() == nil && s.roomLocked() == 0 {
				s.m.cond.Wait()
			}
			s.m.mu.Unlock()
		}
	}
	return total, nil
}

// CloseWrite sends the stream's end once the queued bytes are out.
func (s *MuxStream) CloseWrite() error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if err := s.writeErrLocked(); err != nil {
		return err
	}
	s.wclosed = true
	s.m.commitLocked(appendFrame(s.m.wq, muxFin, s.id, nil))
	return nil
}

// Abort resets the stream.
func (s *MuxStream) Abort() error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.resetLocked()
	s.forgetLocked()
	return nil
}

func (s *MuxStream) resetLocked() {
	if s.m.err == nil && s.m.streams[s.id] == s {
		s.m.commitLocked(appendFrame(s.m.wq, muxRst, s.id, nil))
	}
	if s.werr == nil {
		s.werr = errMuxReset
	}
}

// Close ends the stream; one not ended both ways is reset, as HTTP/2
// cancels a stream closed early.
func (s *MuxStream) Close() error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if !(s.wclosed && s.rerr == io.EOF) && s.werr == nil {
		s.resetLocked()
	}
	s.forgetLocked()
	return nil
}

// forgetLocked drops the stream from its connection, which closes when it
// was the last one and AutoClose is set.
func (s *MuxStream) forgetLocked() {
	s.closed = true
	s.m.cond.Broadcast()
	if s.m.streams[s.id] != s {
		return
	}
	delete(s.m.streams, s.id)
	if s.m.autoClose && len(s.m.streams) == 0 && s.m.err == nil {
		s.m.closeLocked(false)
	}
}

var (
	_ engine.StreamEndpoint = (*MuxStream)(nil)
	_ engine.Homed          = (*MuxStream)(nil)
	_ engine.ConnDriver     = muxDriver{}
)
