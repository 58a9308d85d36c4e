package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/metrics"
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
type connInfo struct {
	direction string
	start     time.Time

	src, dst    netip.AddrPort
	hboneAddr   string
	srcWorkload *state.Workload
	srcIdentity identity.Identity // proven by mTLS; zero for plaintext
	dstWorkload *state.Workload
	dstIdentity identity.Identity
	service     *state.Service
	mtls        bool
	// srcBaggage describes the source when it came through a network
	// gateway (from its baggage); it replaces srcWorkload in telemetry.
	srcBaggage *state.Workload

	counters engine.Counters
	metric   *metrics.Conn // nil until opened

	// policyClosed holds the reason when a policy change closed the
	// connection (set by the connection manager's goroutine).
	policyClosed atomic.Pointer[string]
}

// trackPolicy registers an authorized inbound connection with the
// connection manager; a later policy that denies it aborts both ends. The
// returned function untracks it.
func (p *Proxy) trackPolicy(ci *connInfo, snap *state.Snapshot, c state.Conn, ends ...engine.Endpoint) func() {
	t := p.cfg.Conns.Track(snap, c, func(reason string) {
		ci.policyClosed.Store(&reason)
		for _, e := range ends {
			_ = e.Abort()
		}
	})
	return t.Untrack
}

// relayOutcome turns a relay's result into flags and the logged error,
// reporting a policy-change close as a DENY.
func (ci *connInfo) relayOutcome(r engine.Result) (metrics.ResponseFlags, error) {
	if reason := ci.policyClosed.Load(); reason != nil {
		return metrics.FlagDeny, errors.New(*reason)
	}
	return metrics.FlagNone, relayErr(r)
}

func newConnInfo(direction string, src netip.AddrPort) *connInfo {
	return &connInfo{direction: direction, start: time.Now(), src: src}
}

// reporter is the metrics reporter of the connection's direction.
func (ci *connInfo) reporter() metrics.Reporter {
	if ci.direction == dirInbound {
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
	l := metrics.ConnLabels{Reporter: ci.reporter(), SecurityPolicy: metrics.SecurityUnknown}
	if ci.mtls {
		l.SecurityPolicy = metrics.SecurityMutualTLS
		l.SetPeerSource(&metrics.Peer{Identity: ci.srcIdentity.String()})
	}
	if ci.srcBaggage != nil {
		// The peer address is the gateway's; the source's own baggage says
		// who it is, and mTLS proved its identity.
		ci.srcWorkload = ci.srcBaggage
		l.SetSource(metricsWorkload(ci.srcWorkload, ci.srcIdentity))
	} else if ci.srcWorkload != nil {
		l.SetSource(metricsWorkload(ci.srcWorkload, ci.srcWorkload.Identity()))
	}
	if ci.dstWorkload != nil {
		l.SetDestination(metricsWorkload(ci.dstWorkload, ci.dstIdentity))
	}
	if ci.service != nil {
		l.SetDestinationService(ci.service.Hostname, ci.service.Name, ci.service.Namespace)
	}
	// A is always the downstream side of the relay.
	ci.metric = p.cfg.Metrics.ConnOpened(&l, &ci.counters.AToB, &ci.counters.BToA)
	if p.access.Enabled(context.Background(), slog.LevelDebug) {
		p.access.LogAttrs(context.Background(), slog.LevelDebug, "connection opened", ci.attrs(false)...)
	}
}

// attrs lists the access-log fields in ztunnel's order.
func (ci *connInfo) attrs(withBytes bool) []slog.Attr {
	a := make([]slog.Attr, 0, 18)
	add := func(k, v string) {
		if v != "" {
			a = append(a, slog.String(k, v))
		}
	}
	a = append(a, slog.Any("src.addr", ci.src))
	if w := ci.srcWorkload; w != nil {
		add("src.workload", w.Name)
		add("src.namespace", w.Namespace)
	}
	add("src.identity", ci.srcIdentity.String())
	if w := ci.srcWorkload; w != nil {
		add("src.cluster", w.ClusterID)
	}
	if ci.dst.IsValid() {
		a = append(a, slog.Any("dst.addr", ci.dst))
	}
	add("dst.hbone_addr", ci.hboneAddr)
	if ci.service != nil {
		add("dst.service", ci.service.Hostname)
	}
	if w := ci.dstWorkload; w != nil {
		add("dst.workload", w.Name)
		add("dst.namespace", w.Namespace)
		add("dst.identity", ci.dstIdentity.String())
		add("dst.cluster", w.ClusterID)
	}
	a = append(a, slog.String("direction", ci.direction))
	if withBytes {
		sent, recv := ci.counters.AToB.Load(), ci.counters.BToA.Load()
		if ci.direction == dirInbound {
			sent, recv = recv, sent
		}
		a = append(a, slog.Int64("bytes_sent", sent), slog.Int64("bytes_recv", recv),
			slog.String("duration", fmt.Sprintf("%dms", time.Since(ci.start).Milliseconds())))
	}
	return a
}

// complete ends a connection that was opened: metrics closed with flags,
// "connection complete" at INFO, or at ERROR with the error.
func (p *Proxy) complete(ci *connInfo, flags metrics.ResponseFlags, err error) {
	if ci.metric == nil {
		p.open(ci)
	}
	ci.metric.Closed(flags)
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelError
	}
	// The attributes cost ~3% of the daemon's CPU per connection at high
	// connection rates: build them only for a log that will be written.
	if !p.access.Enabled(context.Background(), level) {
		return
	}
	attrs := ci.attrs(true)
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	p.access.LogAttrs(context.Background(), level, "connection complete", attrs...)
}

// failed ends a connection that never got a route: "connection failed" at
// WARN with the source, destination, direction and error only.
func (p *Proxy) failed(ci *connInfo, err error) {
	attrs := []slog.Attr{slog.Any("src.addr", ci.src)}
	if ci.dst.IsValid() {
		attrs = append(attrs, slog.Any("dst.addr", ci.dst))
	}
	attrs = append(attrs, slog.String("direction", ci.direction), slog.String("error", err.Error()))
	p.access.LogAttrs(context.Background(), slog.LevelWarn, "connection failed", attrs...)
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
