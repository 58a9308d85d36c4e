package enginetest

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/ztunnel-go/ztunnel/engine"
)

// Stream is an engine.StreamEndpoint carried over a TCP connection: it
// stands in for an HBONE stream, so that the suite runs every scenario
// through the TCP⇄stream relays too, without depending on hbone. Its send
// and receive windows are small (Window bytes), so relays meet shut windows
// often. Two goroutines of its own move bytes between the connection and its
// buffers.
//
// Like an HBONE stream it offers what it receives to a Waker that is an
// engine.DirectSink (the epoll relays) whenever nothing received before is
// still buffered, so the scenarios run through the direct path and its
// fall-backs too.
//
// It keeps to the letter of the wake-up contract, so that a relay relying on
// more fails here rather than in production: it wakes its Waker for send
// room only after a WriteWindow or TryWrite found the window shut (as an
// HBONE stream does), and every other TryWrite takes only part of what
// WriteWindow promised (as an HBONE stream does when other streams filled
// the connection's window or write buffer meanwhile), which owes no Wake.
type Stream struct {
	c *net.TCPConn

	mu       sync.Mutex // guards the following fields
	cond     sync.Cond
	rbuf     []byte // received, unread: at most Window bytes
	rerr     error  // reported once rbuf is drained (io.EOF, or a reset)
	sq       []byte // queued for sending: at most Window bytes
	werr     error  // a failed write or a reset: writing fails from now on
	wclosed  bool   // CloseWrite was called
	finSent  bool   // the writer is shutting down, or has shut down, c's write side
	closed   bool   // Close or Abort was called
	aborted  bool
	waker    engine.Waker
	sendDone bool // the writer has ended
	owed     bool // a shut send window was reported: Wake when it opens
	short    bool // the next TryWrite takes only part of what fits
}

// Window is the stream's flow-control window in each direction.
const Window = 64 << 10

// NewStream starts a Stream over c, which it owns from now on.
func NewStream(c *net.TCPConn) *Stream {
	s := &Stream{c: c}
	s.cond.L = &s.mu
	go s.receive()
	go s.send()
	return s
}

func (s *Stream) wakeLocked() {
	s.cond.Broadcast()
	if s.waker != nil {
		s.waker.Wake()
	}
}

func (s *Stream) receive() {
	buf := make([]byte, 16<<10)
	for {
		s.mu.Lock()
		for len(s.rbuf) >= Window && !s.closed {
			s.cond.Wait()
		}
		if s.closed {
			s.mu.Unlock()
			return
		}
		room := min(Window-len(s.rbuf), len(buf))
		s.mu.Unlock()
		n, err := s.c.Read(buf[:room])
		s.mu.Lock()
		if err == io.EOF && !s.finSent && (s.werr != nil || engine.WasReset(s.c)) {
			// The writer's failed send took the reset's error (Linux
			// hands it to one caller), so the read saw a plain end:
			// pass it on as the reset it was. Either the writer has
			// recorded its failure already (and may have closed c),
			// or c is still open and shows the reset by its state:
			// a reset moves a socket to CLOSE, a FIN (before ours)
			// leaves it in CLOSE_WAIT. finSent, which the writer sets
			// under this lock before shutting down, rules out CLOSE
			// reached through our own FIN.
			err = &net.OpError{Op: "read", Net: "tcp", Source: s.c.LocalAddr(), Addr: s.c.RemoteAddr(), Err: os.NewSyscallError("read", syscall.ECONNRESET)}
		}
		data := buf[:n]
		if ds, ok := s.waker.(engine.DirectSink); ok && len(data) > 0 && len(s.rbuf) == 0 && !s.closed && s.rerr == nil {
			// As an HBONE stream does: bytes with none before them
			// still buffered go to the relay's socket at once, when
			// it takes them.
			data = data[ds.TryDeliver(data):]
		}
		s.rbuf = append(s.rbuf, data...)
		if err != nil && s.rerr == nil {
			s.rerr = err
			if err != io.EOF && s.werr == nil {
				s.werr = err // a reset ends both directions
			}
		}
		s.wakeLocked()
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (s *Stream) send() {
	out := make([]byte, 0, Window)
	shut := false
	for {
		s.mu.Lock()
		for len(s.sq) == 0 && !s.closed && s.werr == nil && (!s.wclosed || shut) {
			s.cond.Wait()
		}
		if s.aborted || s.werr != nil || (len(s.sq) == 0 && s.closed) {
			s.sendDone = true
			aborted := s.aborted
			s.mu.Unlock()
			if !aborted {
				_ = s.c.Close()
			}
			return
		}
		if len(s.sq) == 0 {
			s.finSent = true
			s.mu.Unlock()
			_ = s.c.CloseWrite()
			shut = true
			continue
		}
		out = append(out[:0], s.sq...)
		s.sq = s.sq[:0]
		s.mu.Unlock()
		_, err := s.c.Write(out)
		s.mu.Lock()
		if err != nil && s.werr == nil {
			s.werr = err
			s.owed = true // writing failed: TryWrite can tell
		}
		s.cond.Broadcast() // the window reopened, or writing failed
		if s.owed {
			s.owed = false
			s.wakeLocked()
		}
		s.mu.Unlock()
	}
}

// SetWaker implements engine.StreamEndpoint.
func (s *Stream) SetWaker(w engine.Waker) {
	s.mu.Lock()
	s.waker = w
	s.mu.Unlock()
}

// TryRead implements engine.StreamEndpoint.
func (s *Stream) TryRead(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, net.ErrClosed
	}
	if len(s.rbuf) == 0 {
		return 0, s.rerr
	}
	n := copy(p, s.rbuf)
	s.rbuf = s.rbuf[:copy(s.rbuf, s.rbuf[n:])]
	s.cond.Broadcast() // the receive window reopened
	return n, nil
}

// TryWrite implements engine.StreamEndpoint.
func (s *Stream) TryWrite(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writeErrLocked(); err != nil {
		return 0, err
	}
	n := min(len(p), Window-len(s.sq))
	if n > 1 {
		s.short = !s.short
		if s.short {
			n -= n / 2
		}
	}
	s.sq = append(s.sq, p[:n]...)
	switch {
	case n > 0:
		s.cond.Broadcast()
	case len(p) > 0:
		s.owed = true
	}
	return n, nil
}

func (s *Stream) writeErrLocked() error {
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

// WriteWindow implements engine.StreamEndpoint.
func (s *Stream) WriteWindow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErrLocked() != nil {
		return 0
	}
	n := Window - len(s.sq)
	if n == 0 {
		s.owed = true
	}
	return n
}

// Read is the blocking form, for the goroutine relay.
func (s *Stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	for len(s.rbuf) == 0 && s.rerr == nil && !s.closed {
		s.cond.Wait()
	}
	s.mu.Unlock()
	return s.TryRead(p)
}

// Write is the blocking form, for the goroutine relay.
func (s *Stream) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		s.mu.Lock()
		for s.writeErrLocked() == nil && len(s.sq) >= Window {
			s.cond.Wait()
		}
		s.mu.Unlock()
		n, err := s.TryWrite(p)
		total += n
		p = p[n:]
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// CloseWrite sends the end of the stream once the queued bytes are out.
func (s *Stream) CloseWrite() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.werr != nil {
		return s.werr
	}
	s.wclosed = true
	s.cond.Broadcast()
	return nil
}

// Abort resets the connection at once.
func (s *Stream) Abort() error {
	s.mu.Lock()
	if s.aborted {
		s.mu.Unlock()
		return nil
	}
	s.aborted, s.closed = true, true
	if s.werr == nil {
		s.werr = net.ErrClosed
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	_ = s.c.SetLinger(0)
	return s.c.Close()
}

// Close ends the stream: queued bytes still go out, then the connection
// closes. It does not wait.
func (s *Stream) Close() error {
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	return nil
}

var _ engine.StreamEndpoint = (*Stream)(nil)
