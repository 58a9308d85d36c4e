package dnsproxy

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// The TCP side of the proxy: admission with eviction, pipelined queries per
// connection, replies serialized per connection.

// tcpConn is one client TCP connection.
type tcpConn struct {
	c      net.Conn
	client netip.Addr
	pipe   chan struct{}  // a token per forwarded query of this connection until its reply is written
	fwds   sync.WaitGroup // this connection's forwarding goroutines
	wmu    sync.Mutex     // serializes replies: pipelined ones finish in any order

	// Guarded by Server.mu:
	busy    int    // queries read whose reply is not computed yet
	last    uint64 // Server.clock at accept, at a query read or answered
	evicted bool   // closed to admit another connection
}

// serveTCP accepts connections without waiting for one of the MaxTCPConns
// to close: a new connection takes the place of the one active the longest
// ago (admit), so connections that hold a slot and send nothing cannot keep
// an honest client waiting in the kernel's backlog.
func (s *Server) serveTCP(ln net.Listener) {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if !s.pause(&backoff, "DNS accept failed", ln.Addr(), err) {
				return
			}
			continue
		}
		backoff = 0
		if !s.accepted(c) {
			return
		}
	}
}

// accepted serves the new connection c on a goroutine of its own; it
// reports false when the server is stopping (c is closed then).
func (s *Server) accepted(c net.Conn) bool {
	client := clientAddr(c.RemoteAddr())
	if !s.takeFDs(client, 1) {
		c.Close()
		return true
	}
	tc := s.admit(c)
	if tc == nil {
		s.cfg.Budget.Release(client, 1)
		c.Close()
		return false
	}
	s.wg.Go(func() {
		defer s.cfg.Budget.Release(client, 1)
		s.serveConn(tc)
	})
	return true
}

// admit registers a new connection, first evicting one when MaxTCPConns
// are open; it returns nil when the server is stopping.
func (s *Server) admit(c net.Conn) *tcpConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping() {
		return nil
	}
	if len(s.conns) >= s.cfg.MaxTCPConns {
		// Its goroutine sees the closed socket (or the flag, between two
		// reads) and ends; its queries not yet answered get no reply,
		// which RFC 7766 clients retry on a new connection.
		victim := s.evictionLocked()
		victim.evicted = true
		delete(s.conns, victim.c)
		victim.c.Close()
	}
	tc := &tcpConn{c: c, client: clientAddr(c.RemoteAddr()), pipe: make(chan struct{}, s.cfg.MaxTCPPipeline)}
	s.tickLocked(tc)
	s.conns[c] = tc
	return tc
}

// evictionLocked picks the connection to close for a new one: of those
// with no query being answered the one active the longest ago, else (every
// one waits on upstream) the one active the longest ago. Evicting even a
// busy one keeps a new client from being shut out by connections that each
// hold one slow forwarded query.
func (s *Server) evictionLocked() *tcpConn {
	var idle, oldest *tcpConn
	for _, tc := range s.conns {
		if oldest == nil || tc.last < oldest.last {
			oldest = tc
		}
		if tc.busy == 0 && (idle == nil || tc.last < idle.last) {
			idle = tc
		}
	}
	if idle != nil {
		return idle
	}
	return oldest
}

// tickLocked records activity on tc.
func (s *Server) tickLocked(tc *tcpConn) {
	tc.last = s.clock
	s.clock++
}

// serveConn reads length-prefixed queries until the client closes, stays
// idle for TCPIdleTimeout, sends a bad length, or the connection is
// evicted. Local answers are written at once; forwarded queries run in
// goroutines of their own, at most MaxTCPPipeline of the connection at
// once, and are answered as they finish. It returns once every one of
// those has ended.
func (s *Server) serveConn(tc *tcpConn) {
	defer func() {
		tc.fwds.Wait()
		s.mu.Lock()
		delete(s.conns, tc.c)
		s.mu.Unlock()
		tc.c.Close()
	}()
	var hdr [2]byte
	for {
		if !s.armRead(tc) {
			return
		}
		if _, err := io.ReadFull(tc.c, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(hdr[:]))
		if n == 0 || n > MaxRequestSize {
			return
		}
		req := make([]byte, n)
		if _, err := io.ReadFull(tc.c, req); err != nil {
			return
		}
		if !s.begin(tc) {
			return
		}
		out, fwd := s.prepare(s.ctx, req, true)
		if fwd == nil {
			s.end(tc)
			if out == nil || !s.reply(tc, out) {
				return
			}
			continue
		}
		select {
		case tc.pipe <- struct{}{}:
		case <-s.stop:
			s.end(tc)
			return
		}
		if !s.takeForward(tc.client, "tcp") {
			s.end(tc)
			ok := s.reply(tc, s.refuse(s.ctx, fwd))
			<-tc.pipe
			if !ok {
				return
			}
			continue
		}
		tc.fwds.Go(func() {
			// The token is kept until the reply is written: a client
			// that pipelines and never reads holds MaxTCPPipeline
			// goroutines, not one per query it sent.
			defer func() { <-tc.pipe }()
			out := s.resolve(s.ctx, fwd)
			s.releaseForward(tc.client)
			s.end(tc)
			if out == nil || !s.reply(tc, out) {
				tc.c.Close() // ends the read loop too
			}
		})
	}
}

// armRead sets the idle deadline for tc's next query and reports whether
// to read it: not once the server stops or tc was evicted. Under s.mu, so
// that beginStop's wake-up deadline cannot be overwritten.
func (s *Server) armRead(tc *tcpConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping() || tc.evicted {
		return false
	}
	tc.c.SetReadDeadline(time.Now().Add(s.cfg.TCPIdleTimeout))
	return true
}

// begin marks a query of tc as being answered, which makes tc the last to
// be evicted, and reports false if tc was evicted meanwhile.
func (s *Server) begin(tc *tcpConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if tc.evicted {
		return false
	}
	tc.busy++
	s.tickLocked(tc)
	return true
}

// end marks the reply to a query of tc as computed: what is left is the
// client's to read.
func (s *Server) end(tc *tcpConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tc.busy--
	s.tickLocked(tc)
}

// reply writes one length-prefixed reply to tc and reports whether it was
// written before TCPIdleTimeout.
func (s *Server) reply(tc *tcpConn, resp []byte) bool {
	out := make([]byte, 2+len(resp))
	binary.BigEndian.PutUint16(out, uint16(len(resp)))
	copy(out[2:], resp)
	tc.wmu.Lock()
	defer tc.wmu.Unlock()
	tc.c.SetWriteDeadline(time.Now().Add(s.cfg.TCPIdleTimeout))
	_, err := tc.c.Write(out)
	return err == nil
}
