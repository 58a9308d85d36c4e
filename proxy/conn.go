package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/proxy/connmgr"
	"github.com/ztunnel-go/ztunnel/state"
)

// Directions as the access log and ztunnel name them.
const (
	dirInbound  = "inbound"
	dirOutbound = "outbound"
)

// conn is one proxied connection: what the access log says about it (in
// ztunnel's field names and order), its metrics handle, and its lifecycle
// as methods. A handler makes it when a connection arrives (newConn), and
// it ends one of two ways: fail, before a route is known (an early deny),
// or open then end, with the error the connection ended with (its
// response flags come from the error, responseFlags). In between relay or
// relayDial hand both ends to the engine, whose completion calls
// relayEnded.
//
// The relay's counters live here so that metrics read them while bytes
// flow. An idle relayed connection holds one, so its fields are kept
// within the 192-byte size class (TestConnSizeClass): flags share a word,
// the start is a monotonic offset rather than a time.Time, and the source
// identity is shared with the TLS connection or the proxy's own workload.
type conn struct {
	p     *Proxy
	start time.Duration // since procStart, monotonic

	src, dst    netip.AddrPort // dst: outbound the address dialled, inbound the app's
	ext         *connExt       // what only some connections need (telemetry.go)
	srcWorkload *state.Workload
	srcIdentity *identity.Identity // proven by mTLS; nil for plaintext. Shared, not copied: see srcID
	dstWorkload *state.Workload    // its identity is p.router.identityOf(dstWorkload)
	service     *state.Service

	counters engine.Counters
	metric   *metrics.Conn // nil until opened

	// handle is the engine's handle on the relay once it started, the one
	// way to reset it from outside: nothing keeps the endpoints the engine
	// took over. abortReq asks for that reset (a policy change, a drain),
	// also before the relay started (see abortRelay and holdRelay).
	handle   atomic.Pointer[engine.Handle]
	abortReq atomic.Bool
	inbound  bool // the direction: inbound (else outbound)
	mtls     bool
	// accepted says the proxy accepted the connection's socket and lists
	// it in p.relays (listAccepted): the relay's end counts the socket
	// closed and releases it.
	accepted bool
	// listed says an inbound HBONE connection is listed in p.relays for
	// the connections dump (listStream), without an accepted socket.
	listed   bool
	relayIdx int // in p.relays, guarded by p.mu; see accepted and listed

	// tracked is the connection manager's record of an authorized inbound
	// connection (trackPolicy); nil otherwise. It refers to this conn for
	// the connection's attributes (PolicyConn) rather than copying them.
	tracked *connmgr.Tracked
	// policyClosed holds the reason when a policy change closed the
	// connection (set by the connection manager's goroutine).
	policyClosed atomic.Pointer[string]
}

// procStart is the origin of conn.start: a time.Duration since it keeps
// the monotonic clock in a third of time.Time's room.
var procStart = time.Now()

// newConn is the record of a connection of p from src, in direction dir.
func newConn(p *Proxy, dir string, src netip.AddrPort) *conn {
	return &conn{p: p, inbound: dir == dirInbound, start: time.Since(procStart), src: src}
}

// srcID is the source's identity, zero for plaintext.
func (c *conn) srcID() identity.Identity {
	if c.srcIdentity == nil {
		return identity.Identity{}
	}
	return *c.srcIdentity
}

// direction is the access log's name of the connection's direction.
func (c *conn) direction() string {
	if c.inbound {
		return dirInbound
	}
	return dirOutbound
}

// reporter is the metrics reporter of the connection's direction.
func (c *conn) reporter() metrics.Reporter {
	if c.inbound {
		return metrics.ReporterDestination
	}
	return metrics.ReporterSource
}

// open registers the connection with the metrics once its route is known
// and logs "connection opened" at debug.
func (c *conn) open() {
	l := c.labels()
	// A is always the downstream side of the relay.
	c.metric = c.p.cfg.Metrics.ConnOpened(&l, &c.counters.AToB, &c.counters.BToA)
	c.logOpened(&l)
}

// end ends a connection (opening it first if it was not): metrics closed
// with the error's response flags, "connection complete" at INFO, or at
// ERROR with the error.
func (c *conn) end(err error) {
	if c.metric == nil {
		c.open()
	}
	c.metric.Closed(responseFlags(err))
	c.logComplete(err)
}

// fail ends a connection that never got a route: "connection failed" at
// WARN with the source, destination, direction and error only (ztunnel's
// log_early_deny).
func (c *conn) fail(err error) {
	c.p.access.LogAttrs(context.Background(), slog.LevelWarn, "connection failed", c.failedAttrs(err)...)
}

// relay hands the relay between a and b to the engine; relayEnded runs
// when it ends. The proxy resets relays through their Handle (abortRelay).
func (c *conn) relay(a, b engine.Endpoint) {
	c.holdRelay(c.p.engine.Start(a, b, &c.counters, c.relayEnded))
}

// relayDial connects to dst with d and relays between tc and the new
// connection (Engine.StartDial: on the epoll backend the event loop
// completes the connect); relayEnded runs when it ends, and reports a
// failed connect as such.
func (c *conn) relayDial(ctx context.Context, tc *net.TCPConn, d *engine.Dialer, dst netip.AddrPort) {
	c.holdRelay(c.p.engine.StartDial(ctx, engine.TCPEndpoint{TCPConn: tc}, d, netip.Addr{}, dst, &c.counters, c.relayEnded))
}

// holdRelay keeps the relay's handle for abortRelay. An abort asked for
// before the handle was stored is passed on here; one asked for after
// finds the handle (both atomics are sequentially consistent, so at least
// one side sees the other).
func (c *conn) holdRelay(h *engine.Handle) {
	c.handle.Store(h)
	if c.abortReq.Load() {
		h.Abort(nil)
	}
}

// relayEnded is the end of a relay started by relay or relayDial: the
// connection is untracked, ended and unlisted; one method for every path,
// so a relay holds no closure of its own.
func (c *conn) relayEnded(res engine.Result) {
	c.tracked.Untrack()
	c.end(c.relayOutcome(res))
	if c.accepted {
		c.p.cfg.Metrics.SocketClosed(c.reporter())
	}
	if c.accepted || c.listed {
		c.unlist()
	}
	c.releaseBudget() // budget.go; before Drain may return
	if c.accepted {
		c.p.wg.Done() // the accepted connection's (acceptLoop)
	}
}

// relayOutcome is the error a relay's result ends the connection with
// (nil for an ordinary end, see relayErr), marked with its response flags:
// a policy-change close is a DENY, a failed connect a CONNECT failure, a
// tunnel closed under it by a CRL reload (crl.go) CERT_REVOKED.
func (c *conn) relayOutcome(r engine.Result) error {
	if reason := c.policyClosed.Load(); reason != nil {
		return withFlags(metrics.FlagDeny, errors.New(*reason))
	}
	if ce, ok := errors.AsType[*engine.ConnectError](r.Err); ok {
		return withFlags(metrics.FlagConnect, fmt.Errorf("connect to %s: %w", ce.Dst, ce.Err))
	}
	if errors.Is(r.Err, ErrPeerRevoked) {
		// Not an ordinary end (relayErr), whatever else the error says.
		return withFlags(metrics.FlagCertRevoked, r.Err)
	}
	return relayErr(r)
}

// relayErr filters the relay's outcome the way ztunnel does: a peer that
// resets or closes early is an ordinary end of a connection, not an error
// of the proxy.
func relayErr(r engine.Result) error {
	err := r.Err
	if err == nil || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ENOTCONN) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	return err
}

// abortRelay resets the connection's relay (RST to both peers), now or as
// soon as it starts.
func (c *conn) abortRelay() {
	c.abortReq.Store(true)
	if h := c.handle.Load(); h != nil {
		h.Abort(nil)
	}
}

// trackPolicy registers an authorized inbound connection with the
// connection manager; a later policy that denies it aborts its relay. The
// relay's end untracks it. snap allowed c.PolicyConn(): the manager reads
// the attributes from c on each re-check instead of keeping a copy.
func (c *conn) trackPolicy(snap *state.Snapshot) {
	c.tracked = c.p.cfg.Conns.TrackConn(snap, c)
}

// PolicyConn is what the connection was authorized with, for the connection
// manager's re-checks (connmgr.Conn).
func (c *conn) PolicyConn() state.Conn {
	return state.Conn{Src: c.src, Dst: c.dst, SrcIdentity: c.srcID(), DstWorkload: c.dstWorkload}
}

// PolicyClose is the connection manager's close (connmgr.Conn): it records
// the reason and resets the relay.
func (c *conn) PolicyClose(reason string) {
	c.policyClosed.Store(&reason)
	c.abortRelay()
}

// listAccepted is called as the accepted socket tc is handed to the
// engine: from then on the connection is listed in p.relays (Drain resets
// it with abortRelay, Connections dumps it), and nothing keeps tc, which
// the engine closes at once. The relay's end unlists it.
func (c *conn) listAccepted(tc *net.TCPConn) {
	c.accepted = true
	p := c.p
	p.mu.Lock()
	delete(p.conns, tc)
	c.listLocked()
	p.mu.Unlock()
}

// listStream lists an inbound HBONE connection, whose relay is about to
// start, with the relayed ones: for the connections dump and Drain's
// resets. Its relay's end unlists it.
func (c *conn) listStream() {
	c.listed = true
	c.p.mu.Lock()
	c.listLocked()
	c.p.mu.Unlock()
}

func (c *conn) listLocked() {
	p := c.p
	c.relayIdx = len(p.relays)
	p.relays = append(p.relays, c)
}

// unlist removes the connection from p.relays.
func (c *conn) unlist() {
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	i, last := c.relayIdx, len(p.relays)-1
	p.relays[i] = p.relays[last]
	p.relays[i].relayIdx = i
	p.relays[last] = nil
	p.relays = p.relays[:last]
	// Give memory back after a burst of connections.
	if n := cap(p.relays); n > 1024 && last < n/4 {
		p.relays = append(make([]*conn, 0, n/2), p.relays...)
	}
}
