package enginetest

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"

	"github.com/ztunnel-go/ztunnel/engine"
)

// MuxPeer is the far end of a Mux, standing in for the remote HBONE
// daemon: each stream the Mux opens is bridged to the TCP socket open
// returns, with FIN and reset carried both ways (a reset of the socket
// becomes a reset frame and the other way round) and the connection's
// loss resetting every stream not ended yet, as the loss of an HBONE
// connection does. One goroutine reads the connection, two more serve
// each open stream (from and to its socket).
type MuxPeer struct {
	c    *net.TCPConn
	open func(id uint32) *net.TCPConn

	wmu sync.Mutex // serialises frame writes to c

	mu      sync.Mutex // guards the following fields and every peerStream's
	streams map[uint32]*peerStream
	dead    bool
	done    chan struct{}
}

// peerStream is one bridged stream of a MuxPeer.
type peerStream struct {
	id       uint32
	c        *net.TCPConn
	cond     sync.Cond
	buf      []byte // received, not yet written to c
	credit   int    // what the Mux may still receive
	fin      bool   // the Mux's FIN arrived
	rst      bool   // reset (either way) or the connection lost
	werr     bool   // a write to c failed
	finSent  bool   // c's write side was shut
	upDone   bool
	downDone bool
}

// NewMuxPeer serves c, the far end of a Mux's connection; open returns
// the socket each new stream is bridged to, or nil for a stream the
// peer's reader echoes itself, frame by frame (no goroutine of its own;
// the Mux's side must keep less than MuxWindow bytes in flight on it).
func NewMuxPeer(c *net.TCPConn, open func(id uint32) *net.TCPConn) *MuxPeer {
	p := &MuxPeer{c: c, open: open, streams: make(map[uint32]*peerStream), done: make(chan struct{})}
	go p.readLoop()
	return p
}

// Done is closed once the peer has seen the connection end.
func (p *MuxPeer) Done() <-chan struct{} { return p.done }

func (p *MuxPeer) send(kind byte, id uint32, payload []byte) {
	p.wmu.Lock()
	_, _ = p.c.Write(appendFrame(nil, kind, id, payload))
	p.wmu.Unlock()
}

func (p *MuxPeer) readLoop() {
	in := make([]byte, 0, muxInBuf)
	var err error
	for err == nil {
		var n int
		n, err = p.c.Read(in[len(in):cap(in)])
		in = in[:len(in)+n]
		var k int
		k, perr := parseFrames(in, p.frame)
		in = in[:copy(in, in[k:])]
		if perr != nil {
			err = perr
		}
	}
	// The connection is over: streams not ended both ways are reset;
	// one whose FIN came (and whose socket's end went out) still writes
	// what it holds, as a fully received HTTP/2 stream outlives a GOAWAY.
	p.mu.Lock()
	p.dead = true
	for _, s := range p.streams {
		if s.c != nil && (!s.fin || !s.upDone) {
			s.rst = true
			abort(s.c)
		}
		s.cond.Broadcast()
	}
	p.mu.Unlock()
	_ = p.c.Close()
	close(p.done)
}

func (p *MuxPeer) frame(kind byte, id uint32, payload []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if kind == muxOpen {
		s := &peerStream{id: id, c: p.open(id), credit: MuxWindow}
		s.cond.L = &p.mu
		p.streams[id] = s
		if s.c != nil {
			go p.up(s)
			go p.down(s)
		}
		return nil
	}
	s := p.streams[id]
	if s == nil {
		return nil
	}
	if s.c == nil {
		return p.echoLocked(s, kind, payload)
	}
	switch kind {
	case muxData:
		if len(s.buf)+len(payload) > MuxWindow {
			return errors.New("enginetest: mux peer: stream overran its window")
		}
		s.buf = append(s.buf, payload...)
	case muxFin:
		s.fin = true
	case muxRst:
		if !s.rst {
			s.rst = true
			abort(s.c)
		}
	case muxCredit:
		s.credit += int(binary.BigEndian.Uint32(payload))
	}
	s.cond.Broadcast()
	return nil
}

// echoLocked answers a frame of an echo stream: data back with its
// credit, FIN with FIN, reset ends it.
func (p *MuxPeer) echoLocked(s *peerStream, kind byte, payload []byte) error {
	switch kind {
	case muxData:
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(len(payload)))
		p.wmu.Lock()
		out := appendFrame(nil, muxCredit, s.id, b[:])
		out = appendFrame(out, muxData, s.id, payload)
		_, _ = p.c.Write(out)
		p.wmu.Unlock()
	case muxFin:
		p.send(muxFin, s.id, nil)
		delete(p.streams, s.id)
	case muxRst:
		delete(p.streams, s.id)
	}
	return nil
}

// down writes what the Mux sent to the stream's socket.
func (p *MuxPeer) down(s *peerStream) {
	var out []byte
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.endedLocked(s, &s.downDone)
	for {
		for len(s.buf) == 0 && !s.fin && !s.rst {
			s.cond.Wait()
		}
		if s.rst {
			return
		}
		if len(s.buf) == 0 {
			s.finSent = true
			_ = s.c.CloseWrite()
			return
		}
		out, s.buf = s.buf, out[:0]
		p.mu.Unlock()
		_, err := s.c.Write(out)
		if err == nil {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], uint32(len(out)))
			p.send(muxCredit, s.id, b[:])
		}
		p.mu.Lock()
		if err != nil {
			s.werr = true
			if !s.rst {
				s.rst = true
				p.send(muxRst, s.id, nil)
				abort(s.c)
			}
			return
		}
	}
}

// up reads the stream's socket and sends what it reads, within the
// Mux's credit.
func (p *MuxPeer) up(s *peerStream) {
	buf := make([]byte, muxMaxFrame)
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.endedLocked(s, &s.upDone)
	for {
		for s.credit == 0 && !s.rst {
			s.cond.Wait()
		}
		if s.rst {
			return
		}
		n := min(s.credit, len(buf))
		p.mu.Unlock()
		k, err := s.c.Read(buf[:n])
		if k > 0 {
			// Sent unlocked: a frame of a stream reset meanwhile is
			// dropped by the Mux.
			p.send(muxData, s.id, buf[:k])
		}
		p.mu.Lock()
		s.credit -= k
		if s.rst {
			return
		}
		switch {
		case err == io.EOF && !s.finSent && (s.werr || engine.WasReset(s.c)):
			// The socket was reset, but the write took the error (see
			// Stream.receive): pass it on as the reset it was.
			err = syscall.ECONNRESET
		case err == io.EOF:
			p.send(muxFin, s.id, nil)
			return
		}
		if err != nil {
			s.rst = true
			p.send(muxRst, s.id, nil)
			abort(s.c)
			return
		}
	}
}

// endedLocked marks one of the stream's goroutines done and closes the
// socket after both.
func (p *MuxPeer) endedLocked(s *peerStream, half *bool) {
	*half = true
	s.cond.Broadcast()
	if s.upDone && s.downDone {
		delete(p.streams, s.id)
		if !s.rst {
			_ = s.c.Close()
		}
	}
}
