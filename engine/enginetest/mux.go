package enginetest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel/engine"
	"golang.org/x/sys/unix"
)

// Mux is a fake multiplexed connection standing in for a pooled HBONE
// connection, so that the suite runs every scenario with the stream's
// connection owned by the relay's loop (engine.TakeConn) without
// depending on hbone. Its streams (MuxStream) are StreamEndpoints and
// Homed; on the wire each frame is "kind, stream id, length, payload"
// (muxHeader bytes, then the payload), with per-stream flow control in
// both directions (MuxWindow bytes, returned by credit frames as the
// receiver consumes) and a bound on the bytes committed and not yet
// written (muxMaxQueued), as an HBONE connection's write buffer.
//
// Driven by the loop, it is a ConnDriver: Readable parses frames and
// hands payloads to the relays (TryDeliver when nothing is buffered,
// else the handle's WakeLocal), commits wake the connection and leave in its Flush.
// Where TakeConn answers ErrUnsupported (std, uring) it falls back to a
// reader and a writer goroutine, as hbone's goroutine driver does, and
// the relays then run on goroutines too.
//
// Its far end is a MuxPeer, which bridges each stream to a TCP socket.
type Mux struct {
	h  *engine.ConnHandle // nil when driven by goroutines
	fd int                // the loop's descriptor (loop mode)
	nc *net.TCPConn       // goroutine mode

	autoClose bool // close the connection when its last stream ends
	noHome    bool // streams report no Home (placement test)

	mu      sync.Mutex // guards the following fields and every stream's
	cond    sync.Cond  // the writer goroutine, blocking stream calls
	streams map[uint32]*MuxStream
	nextID  uint32
	err     error  // set once the connection is over: what streams fail with
	endErr  error  // what ended it (Ended's error; nil after a clean close)
	qOwed   bool   // a write found the write queue full
	wq      []byte // committed frames not yet handed to the socket
	queued  int    // bytes committed and not yet written (wq and unsent)
	closing bool   // goroutine mode: close once wq is out
	local   bool   // loop mode: inside a driver callback (WakeLocal is allowed)

	// Loop mode, owned by the loop goroutine.
	in     []byte // input not yet parsed
	unsent []byte // taken from wq, refused by the socket so far

	done chan struct{} // closed when the connection is over

	// Flushes counts the driver's Flush calls, Commits the frames
	// committed (tests).
	Flushes, Commits atomic.Int64
}

// Frame kinds.
const (
	muxOpen   byte = iota // a new stream
	muxData               // payload bytes
	muxFin                // the sender's end of the stream
	muxRst                // the stream is reset (both ways)
	muxCredit             // 4-byte payload: the receiver consumed that many bytes
)

const (
	muxHeader    = 9         // kind (1), stream id (4), payload length (4)
	muxMaxFrame  = 16 << 10  // largest payload
	muxMaxQueued = 256 << 10 // committed and not yet written
	muxInBuf     = 64 << 10  // input buffer: room for a whole frame after parsing
	muxBudget    = 64 << 10  // input bytes per Readable turn
	// MuxWindow is each stream's flow-control window in each direction.
	MuxWindow = 64 << 10
)

var (
	errMuxReset = errors.New("enginetest: mux stream reset")
	errMuxLost  = errors.New("enginetest: mux connection lost")
)

func appendFrame(b []byte, kind byte, id uint32, payload []byte) []byte {
	b = append(b, kind)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

func appendCredit(b []byte, id uint32, n int) []byte {
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], uint32(n))
	return appendFrame(b, muxCredit, id, p[:])
}

// parseFrames calls fn for each whole frame at the start of b and returns
// how many bytes they took.
func parseFrames(b []byte, fn func(kind byte, id uint32, payload []byte) error) (int, error) {
	off := 0
	for len(b)-off >= muxHeader {
		n := int(binary.BigEndian.Uint32(b[off+5:]))
		if n > muxMaxFrame {
			return off, fmt.Errorf("enginetest: mux frame of %d bytes", n)
		}
		if len(b)-off < muxHeader+n {
			break
		}
		if err := fn(b[off], binary.BigEndian.Uint32(b[off+1:]), b[off+muxHeader:off+muxHeader+n]); err != nil {
			return off, err
		}
		off += muxHeader + n
	}
	return off, nil
}

// MuxOptions tunes a Mux.
type MuxOptions struct {
	// AutoClose closes the connection (gracefully) when its last stream
	// ends, as a pool drops an unused connection.
	AutoClose bool
	// NoHome makes the streams report no Home, so their relays are placed
	// round-robin and the Mux's WakeLocal may come from another loop.
	NoHome bool
	// Goroutines drives the connection with goroutines without asking
	// the engine (benchmarks: today's reader-goroutine path).
	Goroutines bool
}

// NewMux makes the engine side of a Mux over c: loop-owned through
// e.TakeConn, or with goroutines where TakeConn says ErrUnsupported;
// err is TakeConn's answer. With another error (the engine is closed)
// the Mux is over from the start: its streams fail.
func NewMux(e *engine.Engine, c *net.TCPConn, opt MuxOptions) (*Mux, error) {
	m := &Mux{fd: -1, streams: make(map[uint32]*MuxStream), done: make(chan struct{}), autoClose: opt.AutoClose, noHome: opt.NoHome}
	m.cond.L = &m.mu
	h, err := (*engine.ConnHandle)(nil), engine.ErrUnsupported
	if !opt.Goroutines {
		h, err = e.TakeConn(c, muxDriver{m}, func(fd int) error { m.fd = fd; return nil })
	}
	switch {
	case err == nil:
		// Known before the loop can call the driver.
		m.h = h
		h.Start()
		return m, nil
	case errors.Is(err, engine.ErrUnsupported):
		m.nc = c
		go m.readLoop()
		go m.writeLoop()
		return m, err
	}
	// The engine refused it (closed, or the takeover failed; c is closed):
	// a connection that is over, whose streams fail.
	m.mu.Lock()
	m.endLocked(err)
	m.mu.Unlock()
	return m, err
}

// Handle is the loop's handle of the connection, nil when driven by
// goroutines.
func (m *Mux) Handle() *engine.ConnHandle { return m.h }

// Done is closed when the connection is over.
func (m *Mux) Done() <-chan struct{} { return m.done }

// Err is what ended the connection (nil while it runs or after a clean
// close).
func (m *Mux) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.endErr
}

// Open starts a stream.
func (m *Mux) Open() *MuxStream {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextID++
	s := &MuxStream{m: m, id: m.nextID, credit: MuxWindow}
	if m.err != nil {
		s.rerr, s.werr = m.err, m.err
		return s
	}
	m.streams[s.id] = s
	m.commitLocked(appendFrame(m.wq, muxOpen, s.id, nil))
	return s
}

// Close ends the connection: gracefully (what is committed goes out
// first), or with a reset.
func (m *Mux) Close(abort bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closeLocked(abort)
}

func (m *Mux) closeLocked(abort bool) {
	if m.h != nil {
		m.h.Close(abort)
		return
	}
	if abort && m.err == nil {
		_ = m.nc.SetLinger(0)
		_ = m.nc.Close()
	}
	m.closing = true
	m.cond.Broadcast()
}

// commitLocked takes wq grown by new frames and wakes whoever writes it.
func (m *Mux) commitLocked(wq []byte) {
	m.queued += len(wq) - len(m.wq)
	m.wq = wq
	m.Commits.Add(1)
	if m.h != nil {
		m.h.Wake()
	} else {
		m.cond.Broadcast()
	}
}

// wroteLocked accounts n committed bytes written and wakes the streams
// that found the write queue full.
func (m *Mux) wroteLocked(n int) {
	m.queued -= n
	if m.qOwed && m.queued < muxMaxQueued {
		m.qOwed = false
		for _, s := range m.streams {
			if s.owed {
				s.owed = false
				s.wakeLocked()
			}
		}
	}
}

// frameLocked handles one received frame.
func (m *Mux) frameLocked(kind byte, id uint32, p []byte) error {
	s := m.streams[id]
	if s == nil {
		return nil // a stream that ended here already
	}
	switch kind {
	case muxData:
		if len(s.rbuf)+len(p) > MuxWindow {
			return fmt.Errorf("enginetest: mux stream %d overran its window", id)
		}
		if s.rerr != nil {
			return nil
		}
		if ds, ok := s.waker.(engine.DirectSink); ok && len(s.rbuf) == 0 && len(p) > 0 {
			// As an HBONE stream does: bytes with none before them still
			// buffered go straight to the relay's socket when it takes
			// them.
			k := ds.TryDeliver(p)
			s.consumedLocked(k)
			p = p[k:]
			if len(p) == 0 {
				return nil
			}
		}
		s.rbuf = append(s.rbuf, p...)
	case muxFin:
		if s.rerr == nil {
			s.rerr = io.EOF
		}
	case muxRst:
		if s.rerr == nil || s.rerr == io.EOF {
			s.rerr = errMuxReset
		}
		if s.werr == nil {
			s.werr = errMuxReset
		}
	case muxCredit:
		if len(p) != 4 {
			return errors.New("enginetest: bad mux credit frame")
		}
		s.credit += int(binary.BigEndian.Uint32(p))
		if !s.owed {
			return nil
		}
		s.owed = false
	default:
		return fmt.Errorf("enginetest: mux frame kind %d", kind)
	}
	s.wakeLocked()
	return nil
}

// inputLocked parses the whole frames in m.in and keeps the rest.
func (m *Mux) inputLocked() error {
	n, err := parseFrames(m.in, m.frameLocked)
	m.in = m.in[:copy(m.in, m.in[n:])]
	return err
}

// endLocked ends the connection: every stream fails with err.
func (m *Mux) endLocked(err error) {
	select {
	case <-m.done:
		return
	default:
	}
	m.endErr = err
	if err == nil || err == io.EOF {
		err = errMuxLost
	}
	m.err = err
	for _, s := range m.streams {
		if s.rerr == nil || s.rerr == io.EOF {
			s.rerr = err
		}
		if s.werr == nil {
			s.werr = err
		}
		s.wakeLocked()
	}
	close(m.done)
	m.cond.Broadcast()
}

// readLoop is the goroutine driver's reader.
func (m *Mux) readLoop() {
	m.in = make([]byte, 0, muxInBuf)
	for {
		n, err := m.nc.Read(m.in[len(m.in):cap(m.in)])
		m.mu.Lock()
		m.in = m.in[:len(m.in)+n]
		if perr := m.inputLocked(); perr != nil && err == nil {
			err = perr
		}
		if err != nil {
			m.endLocked(err)
			m.mu.Unlock()
			_ = m.nc.Close()
			return
		}
		m.mu.Unlock()
	}
}

// writeLoop is the goroutine driver's writer.
func (m *Mux) writeLoop() {
	var out []byte
	m.mu.Lock()
	for {
		for len(m.wq) == 0 && m.err == nil && !m.closing {
			m.cond.Wait()
		}
		if m.err != nil {
			m.mu.Unlock()
			_ = m.nc.Close()
			return
		}
		if len(m.wq) == 0 {
			// Closing, all out: FIN, then the reader sees the peer's end.
			m.mu.Unlock()
			_ = m.nc.CloseWrite()
			<-m.done
			return
		}
		out, m.wq = m.wq, out[:0]
		m.mu.Unlock()
		_, err := m.nc.Write(out)
		m.mu.Lock()
		m.wroteLocked(len(out))
		if err != nil {
			m.endLocked(err)
		}
	}
}

// muxDriver is the Mux as the loop's ConnDriver.
type muxDriver struct{ m *Mux }

func (d muxDriver) Readable() (bool, error) {
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	m.local = true
	defer func() { m.local = false }()
	if m.in == nil {
		m.in = make([]byte, 0, muxInBuf)
	}
	total := 0
	for {
		n, err := unix.Read(m.fd, m.in[len(m.in):cap(m.in)])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false, nil
		case err != nil:
			return false, err
		case n == 0:
			return false, io.EOF
		}
		m.in = m.in[:len(m.in)+n]
		if err := m.inputLocked(); err != nil {
			return false, err
		}
		if total += n; total >= muxBudget {
			return true, nil
		}
	}
}

// writeOut writes unsent until the socket refuses; more reports bytes
// still held.
func (m *Mux) writeOut() (more bool, err error) {
	wrote := 0
	for len(m.unsent) > wrote {
		k, werr := unix.Write(m.fd, m.unsent[wrote:])
		if werr == unix.EINTR {
			continue
		}
		if werr == unix.EAGAIN {
			break
		}
		if werr != nil {
			err = werr
			break
		}
		wrote += k
	}
	m.unsent = m.unsent[:copy(m.unsent, m.unsent[wrote:])]
	m.mu.Lock()
	m.local = true
	m.wroteLocked(wrote)
	m.local = false
	m.mu.Unlock()
	return len(m.unsent) > 0, err
}

func (d muxDriver) Writable() (bool, error) {
	if len(d.m.unsent) == 0 {
		return false, nil
	}
	return d.m.writeOut()
}

func (d muxDriver) Flush() error {
	m := d.m
	m.Flushes.Add(1)
	m.mu.Lock()
	m.unsent = append(m.unsent, m.wq...)
	m.wq = m.wq[:0]
	m.mu.Unlock()
	_, err := m.writeOut()
	return err
}

func (d muxDriver) Ended(err error) {
	m := d.m
	m.mu.Lock()
	m.endLocked(err)
	m.mu.Unlock()
}
