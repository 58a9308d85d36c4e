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

// connInfo is one proxied connection's telemetry: what the access log says
// about it (in ztunnel's field names and order) and its metrics handle. The
// relay's counters live here so that metrics read them while bytes flow.
// An idle relayed connection holds one, so its fields are kept within the
// 192-byte size class (TestConnInfoSizeClass): flags share a word, the
// start is a monotonic offset rather than a time.Time, and the source
// identity is shared with the TLS connection or the proxy's own workload.
type connInfo struct {
	p     *Proxy        // set when the relay starts (startRelay)
	start time.Duration // since procStart, monotonic

	src, dst    netip.AddrPort // dst: outbound the address dialled, inbound the app's
	ext         *connExt       // what only some connections need (telemetry.go)
	srcWorkload *state.Workload
	srcIdentity *identity.Identity // proven by mTLS; nil for plaintext. Shared, not copied: see srcID
	dstWorkload *state.Workload    // its identity is p.identityOf(dstWorkload)
	service     *state.Service

	counters engine.Counters
	metric   *metrics.Conn // nil until opened

	// relay is the engine's handle on the relay once it started, the one
	// way to reset it from outside: nothing keeps the endpoints the engine
	// took over. abortReq asks for that reset (a policy change, a drain),
	// also before the relay started (see abortRelay and relayStarted).
	relay    atomic.Pointer[engine.Handle]
	abortReq atomic.Bool
	inbound  bool // the direction: inbound (else outbound)
	mtls     bool
	// accepted says the proxy accepted the connection's socket and tracks
	// it in p.relays (relayed): the relay's end counts the socket closed
	// and releases it.
	accepted bool
	// listed says an inbound HBONE connection is listed in p.relays for
	// the connections dump (listStream), without an accepted socket.
	listed   bool
	relayIdx int // in p.relays, guarded by p.mu; see accepted and listed

	// tracked is the connection manager's record of an authorized inbound
	// connection (trackPolicy); nil otherwise. It refers to this connInfo
	// for the connection's attributes (PolicyConn) rather than copying them.
	tracked *connmgr.Tracked
	// policyClosed holds the reason when a policy change closed the
	// connection (set by the connection manager's goroutine).
	policyClosed atomic.Pointer[string]
}

// srcID is the source's identity, zero for plaintext.
func (ci *connInfo) srcID() identity.Identity {
	if ci.srcIdentity == nil {
		return identity.Identity{}
	}
	return *ci.srcIdentity
}

// procStart is the origin of connInfo.start: a time.Duration since it keeps
// the monotonic clock in a third of time.Time's room.
var procStart = time.Now()

// trackPolicy registers an authorized inbound connection with the
// connection manager; a later policy that denies it aborts its relay. The
// relay's end untracks it. snap allowed ci.PolicyConn(): the manager reads
// the attributes from ci on each re-check instead of keeping a copy.
func (p *Proxy) trackPolicy(ci *connInfo, snap *state.Snapshot) {
	ci.tracked = p.cfg.Conns.TrackConn(snap, ci)
}

// PolicyConn is what the connection was authorized with, for the connection
// manager's re-checks (connmgr.Conn).
func (ci *connInfo) PolicyConn() state.Conn {
	return state.Conn{Src: ci.src, Dst: ci.dst, SrcIdentity: ci.srcID(), DstWorkload: ci.dstWorkload}
}

// PolicyClose is the connection manager's close (connmgr.Conn): it records
// the reason and resets the relay.
func (ci *connInfo) PolicyClose(reason string) {
	ci.policyClosed.Store(&reason)
	ci.abortRelay()
}

// startRelay hands the relay between a and b to the engine; relayEnded runs
// when it ends. The proxy resets relays through their Handle (abortRelay).
func (p *Proxy) startRelay(ci *connInfo, a, b engine.Endpoint) {
	ci.p = p
	ci.holdRelay(p.engine.Start(a, b, &ci.counters, ci.relayEnded))
}

// holdRelay keeps the relay's handle for abortRelay. An abort asked for
// before the handle was stored is passed on here; one asked for after
// finds the handle (both atomics are sequentially consistent, so at least
// one side sees the other).
func (ci *connInfo) holdRelay(h *engine.Handle) {
	ci.relay.Store(h)
	if ci.abortReq.Load() {
		h.Abort(nil)
	}
}

// relayEnded is the end of a relay started by startRelay: the connection is
// untracked, logged and counted; one method for every path, so a relay
// holds no closure of its own.
func (ci *connInfo) relayEnded(res engine.Result) {
	ci.tracked.Untrack()
	p := ci.p
	p.complete(ci, ci.relayOutcome(res))
	switch {
	case ci.accepted:
		p.cfg.Metrics.SocketClosed(ci.reporter())
		p.releaseRelayed(ci)
	case ci.listed:
		p.mu.Lock()
		p.unlistLocked(ci)
		p.mu.Unlock()
	}
}

// startDial connects to dst with d and relays between c and the new
// connection (Engine.StartDial: on the epoll backend the event loop
// completes the connect); relayEnded runs when it ends, and reports a
// failed connect as such.
func (p *Proxy) startDial(ctx context.Context, ci *connInfo, c *net.TCPConn, d *engine.Dialer, dst netip.AddrPort) {
	ci.p = p
	ci.holdRelay(p.engine.StartDial(ctx, engine.TCPEndpoint{TCPConn: c}, d, netip.Addr{}, dst, &ci.counters, ci.relayEnded))
}

// abortRelay resets the connection's relay (RST to both peers), now or as
// soon as it starts.
func (ci *connInfo) abortRelay() {
	ci.abortReq.Store(true)
	if h := ci.relay.Load(); h != nil {
		h.Abort(nil)
	}
}

// relayOutcome is the error a relay's result ends the connection with
// (nil for an ordinary end, see relayErr), marked with its response flags:
// a policy-change close is a DENY, a failed connect a CONNECT failure, a
// tunnel closed under it by a CRL reload (crl.go) CERT_REVOKED.
func (ci *connInfo) relayOutcome(r engine.Result) error {
	if reason := ci.policyClosed.Load(); reason != nil {
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

func newConnInfo(direction string, src netip.AddrPort) *connInfo {
	return &connInfo{inbound: direction == dirInbound, start: time.Since(procStart), src: src}
}

// direction is the access log's name of the connection's direction.
func (ci *connInfo) direction() string {
	if ci.inbound {
		return dirInbound
	}
	return dirOutbound
}

// reporter is the metrics reporter of the connection's direction.
func (ci *connInfo) reporter() metrics.Reporter {
	if ci.inbound {
		return metrics.ReporterDestination
	}
	return metrics.ReporterSource
}

func metricsWorkload(w *state.Workload, id identity.Identity) *metrics.Workload {
	name := w.WorkloadName
	if name == "" {
		name = w.Name
	}
	return &metrics.Workload{
		WorkloadName: name, CanonicalName: w.CanonicalName, CanonicalRevision: w.CanonicalRevision,
		Namespace: w.Namespace, Identity: id.String(), ClusterID: w.ClusterID,
		Region: w.Locality.Region, Zone: w.Locality.Zone,
	}
}

// open registers the connection with the metrics once its route is known
// and logs "connection opened" at debug.
func (p *Proxy) open(ci *connInfo) {
	l := p.labels(ci)
	// A is always the downstream side of the relay.
	ci.metric = p.cfg.Metrics.ConnOpened(&l, &ci.counters.AToB, &ci.counters.BToA)
	if p.access.Enabled(context.Background(), slog.LevelDebug) {
		p.access.LogAttrs(context.Background(), slog.LevelDebug, "connection opened", ci.attrs(&l, false)...)
	}
}

// attrs lists the access-log fields in ztunnel's order and with its
// meanings, from the connection's labels l: dst.addr is the address
// dialled (inbound over HBONE: the one the tunnel arrived on), the
// workloads are named as logNames says, identities appear only for mTLS,
// and unknown values are left out.
func (ci *connInfo) attrs(l *metrics.ConnLabels, withBytes bool) []slog.Attr {
	a := make([]slog.Attr, 0, 18)
	add := func(k, v string) {
		if v != "" {
			a = append(a, slog.String(k, v))
		}
	}
	srcName, dstName := ci.logNames(l)
	mtls := ci.mtls
	a = append(a, slog.Any("src.addr", ci.src))
	add("src.workload", srcName)
	add("src.namespace", l.SourceWorkloadNamespace)
	if mtls {
		add("src.identity", l.SourcePrincipal)
	}
	add("src.cluster", l.SourceCluster)
	if d := ci.logDst(); d.IsValid() {
		a = append(a, slog.Any("dst.addr", d))
	}
	add("dst.hbone_addr", ci.hboneAddr())
	add("dst.service", l.DestinationService)
	add("dst.workload", dstName)
	add("dst.namespace", l.DestinationWorkloadNamespace)
	if mtls {
		add("dst.identity", l.DestinationPrincipal)
	}
	add("dst.cluster", l.DestinationCluster)
	a = append(a, slog.String("direction", ci.direction()))
	if withBytes {
		sent, recv := ci.counters.AToB.Load(), ci.counters.BToA.Load()
		if ci.inbound {
			sent, recv = recv, sent
		}
		a = append(a, slog.Int64("bytes_sent", sent), slog.Int64("bytes_recv", recv),
			slog.String("duration", fmt.Sprintf("%dms", (time.Since(procStart)-ci.start).Milliseconds())))
	}
	return a
}

// complete ends a connection that was opened: metrics closed with the
// error's response flags (responseFlags), "connection complete" at INFO,
// or at ERROR with the error.
func (p *Proxy) complete(ci *connInfo, err error) {
	if ci.metric == nil {
		p.open(ci)
	}
	ci.metric.Closed(responseFlags(err))
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelError
	}
	// The attributes cost ~3% of the daemon's CPU per connection at high
	// connection rates: build them only for a log that will be written.
	if !p.access.Enabled(context.Background(), level) {
		return
	}
	l := p.labels(ci)
	attrs := ci.attrs(&l, true)
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	p.access.LogAttrs(context.Background(), level, "connection complete", attrs...)
}

// failed ends a connection that never got a route: "connection failed" at
// WARN with the source, destination, direction and error only (ztunnel's
// log_early_deny).
func (p *Proxy) failed(ci *connInfo, err error) {
	p.access.LogAttrs(context.Background(), slog.LevelWarn, "connection failed", ci.failedAttrs(err)...)
}

// failedAttrs are the fields of "connection failed": dst.addr is the
// destination asked for outbound, the tunnel's address inbound over HBONE.
func (ci *connInfo) failedAttrs(err error) []slog.Attr {
	attrs := []slog.Attr{slog.Any("src.addr", ci.src)}
	if d := ci.logDst(); d.IsValid() {
		attrs = append(attrs, slog.Any("dst.addr", d))
	}
	return append(attrs, slog.String("direction", ci.direction()), slog.String("error", err.Error()))
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
