package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/state"
)

// The access log of a connection (scope "access"), in ztunnel's field
// names, order and meanings: "connection opened" at debug (conn.open),
// "connection complete" (conn.end) and "connection failed" (conn.fail).

func metricsWorkload(w *state.Workload, id identity.Identity) *metrics.Workload {
	name := w.WorkloadName()
	if name == "" {
		name = w.Name
	}
	return &metrics.Workload{
		WorkloadName: name, CanonicalName: w.CanonicalName(), CanonicalRevision: w.CanonicalRevision(),
		Namespace: w.Namespace(), Identity: id.String(), ClusterID: w.ClusterID(),
		Region: w.Locality().Region, Zone: w.Locality().Zone,
	}
}

// logOpened logs "connection opened" at debug, with the labels l.
func (c *conn) logOpened(l *metrics.ConnLabels) {
	if c.p.access.Enabled(context.Background(), slog.LevelDebug) {
		c.p.access.LogAttrs(context.Background(), slog.LevelDebug, "connection opened", c.attrs(l, false)...)
	}
}

// logComplete logs "connection complete" at INFO, or at ERROR with err.
func (c *conn) logComplete(err error) {
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelError
	}
	// The attributes cost ~3% of the daemon's CPU per connection at high
	// connection rates: build them only for a log that will be written.
	if !c.p.access.Enabled(context.Background(), level) {
		return
	}
	l := c.labels()
	attrs := c.attrs(&l, true)
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	c.p.access.LogAttrs(context.Background(), level, "connection complete", attrs...)
}

// attrs lists the access-log fields in ztunnel's order and with its
// meanings, from the connection's labels l: dst.addr is the address
// dialled (inbound over HBONE: the one the tunnel arrived on), the
// workloads are named as logNames says, identities appear only for mTLS,
// and unknown values are left out.
func (c *conn) attrs(l *metrics.ConnLabels, withBytes bool) []slog.Attr {
	a := make([]slog.Attr, 0, 18)
	add := func(k, v string) {
		if v != "" {
			a = append(a, slog.String(k, v))
		}
	}
	srcName, dstName := c.logNames(l)
	mtls := c.mtls
	a = append(a, slog.Any("src.addr", c.src))
	add("src.workload", srcName)
	add("src.namespace", l.SourceWorkloadNamespace)
	if mtls {
		add("src.identity", l.SourcePrincipal)
	}
	add("src.cluster", l.SourceCluster)
	if d := c.logDst(); d.IsValid() {
		a = append(a, slog.Any("dst.addr", d))
	}
	add("dst.hbone_addr", c.hboneAddr())
	add("dst.service", l.DestinationService)
	add("dst.workload", dstName)
	add("dst.namespace", l.DestinationWorkloadNamespace)
	if mtls {
		add("dst.identity", l.DestinationPrincipal)
	}
	add("dst.cluster", l.DestinationCluster)
	a = append(a, slog.String("direction", c.direction()))
	if withBytes {
		sent, recv := c.counters.AToB.Load(), c.counters.BToA.Load()
		if c.inbound {
			sent, recv = recv, sent
		}
		a = append(a, slog.Int64("bytes_sent", sent), slog.Int64("bytes_recv", recv),
			slog.String("duration", fmt.Sprintf("%dms", (time.Since(procStart)-c.start).Milliseconds())))
	}
	return a
}

// failedAttrs are the fields of "connection failed": dst.addr is the
// destination asked for outbound, the tunnel's address inbound over HBONE.
func (c *conn) failedAttrs(err error) []slog.Attr {
	attrs := []slog.Attr{slog.Any("src.addr", c.src)}
	if d := c.logDst(); d.IsValid() {
		attrs = append(attrs, slog.Any("dst.addr", d))
	}
	return append(attrs, slog.String("direction", c.direction()), slog.String("error", err.Error()))
}
