package admin

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// RefusalReason says which cap refused a connection: the reason label of
// the refusal metric.
type RefusalReason string

// The caps of Limits.
const (
	RefusedPeer  RefusalReason = "peer"  // MaxConnsPerPeer
	RefusedTotal RefusalReason = "total" // MaxConns
)

// writeChunk is the most limitedConn.Write hands the socket under one
// deadline: a client must take that much within WriteTimeout to stay
// connected while a large response goes out.
const writeChunk = 64 << 10

// limitListener enforces the connection caps at accept. A refused
// connection is reset and closed at once, before the HTTP server sees it,
// so it costs no goroutine and no buffer, and one peer's flood cannot
// hold more than its share of the server.
type limitListener struct {
	net.Listener
	name         string
	perPeer      int
	total        int
	writeTimeout time.Duration
	onRefused    func(string, RefusalReason)
	log          *slog.Logger
	refusals     refusalLog

	mu    sync.Mutex // guards the following fields
	peers map[netip.Addr]int
	open  int
}

func newLimitListener(inner net.Listener, cfg ServeConfig, lim Limits) *limitListener {
	return &limitListener{
		Listener:     inner,
		name:         cfg.Name,
		perPeer:      lim.MaxConnsPerPeer,
		total:        lim.MaxConns,
		writeTimeout: lim.WriteTimeout,
		onRefused:    cfg.OnRefused,
		log:          cfg.Logger,
		peers:        make(map[netip.Addr]int),
	}
}

// Accept returns the next connection within the caps; the others are
// refused on the way.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := peerOf(c)
		reason, held := l.admit(peer)
		if reason == "" {
			return &limitedConn{Conn: c, l: l, peer: peer}, nil
		}
		l.refuse(c, peer, reason, held)
	}
}

// peerOf is the connection's source address, IPv4-mapped addresses
// unmapped (a dual-stack listener sees IPv4 clients that way).
func peerOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// admit counts a connection from peer, or says which cap refuses it and
// what the peer held then.
func (l *limitListener) admit(peer netip.Addr) (RefusalReason, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := l.peers[peer]
	switch {
	case held >= l.perPeer:
		return RefusedPeer, held
	case l.open >= l.total:
		return RefusedTotal, held
	}
	l.peers[peer] = held + 1
	l.open++
	return "", 0
}

// release undoes admit.
func (l *limitListener) release(peer netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.peers[peer] - 1; n > 0 {
		l.peers[peer] = n
	} else {
		delete(l.peers, peer)
	}
	l.open--
}

// refuse resets c (no FIN handshake, no TIME_WAIT on our side), counts the
// refusal and logs it if the backoff allows.
func (l *limitListener) refuse(c net.Conn, peer netip.Addr, reason RefusalReason, held int) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
	if l.onRefused != nil {
		l.onRefused(l.name, reason)
	}
	if ok, suppressed := l.refusals.take(time.Now()); ok {
		limit := l.perPeer
		if reason == RefusedTotal {
			limit = l.total
		}
		l.log.Warn("connection refused", "listener", l.name, "peer", peer.String(), "reason", string(reason),
			"limit", limit, "peer_connections", held, "refused_unlogged", suppressed, "scope", "admin")
	}
}

// limitedConn is an admitted connection: it gives its place back when
// closed, and bounds each write (see Limits.WriteTimeout).
type limitedConn struct {
	net.Conn
	l      *limitListener
	peer   netip.Addr
	closed atomic.Bool
}

// Write writes p in chunks of at most writeChunk, each under a fresh write
// deadline, so a response of any size goes out as long as the client
// reads, and a client that stops reading is cut off after WriteTimeout.
// The deadline is set only here: the HTTP server sets none itself (no
// http.Server.WriteTimeout), so a handler that writes nothing for minutes
// (a CPU profile) is not cut.
func (c *limitedConn) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), writeChunk)]
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.l.writeTimeout)); err != nil {
			return n, err
		}
		k, err := c.Conn.Write(chunk)
		n += k
		p = p[k:]
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// CloseWrite half-closes the connection, for the HTTP server's orderly
// close after an oversized request (it looks for this method).
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Close gives the connection's place back, the first time, and closes it.
// The place goes first so that a client which sees the close may count on
// it (the cap may be passed by one socket for that moment).
func (c *limitedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.release(c.peer)
	}
	return c.Conn.Close()
}

// Bounds of the refusal log's backoff.
const (
	refusalLogMin = time.Second
	refusalLogMax = time.Minute
)

// refusalLog spaces out the log lines of a refusal flood: the first
// refusal is logged, then at most one per interval, the interval doubling
// from refusalLogMin to refusalLogMax while refusals go on; each line says
// how many were refused unlogged since the last. After refusalLogMax
// without a refusal past the interval, the next flood starts over.
type refusalLog struct {
	mu         sync.Mutex    // guards the following fields
	last       time.Time     // when the last line was logged; zero before the first
	wait       time.Duration // how long after last no line is logged
	suppressed int           // refusals since the last line
}

// take reports whether a refusal at now is logged, and if so how many
// went unlogged before it.
func (r *refusalLog) take(now time.Time) (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	since := now.Sub(r.last)
	switch {
	case r.last.IsZero() || since >= r.wait+refusalLogMax:
		r.wait = refusalLogMin
	case since < r.wait:
		r.suppressed++
		return false, 0
	default:
		r.wait = min(2*r.wait, refusalLogMax)
	}
	r.last = now
	suppressed, r.suppressed = r.suppressed, 0
	return true, suppressed
}
