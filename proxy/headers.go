package proxy

import (
	"net/http"
	"net/netip"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/proxy/meta"
	"github.com/ztunnel-go/ztunnel/state"
)

// baggageCache holds the baggage value of the last workload it was asked
// for. A proxy serves one workload, whose record changes only with a push,
// so one entry saves formatting the same string on every connection.
type baggageCache struct {
	last atomic.Pointer[baggageEntry]
}

type baggageEntry struct {
	w   *state.Workload
	val string
}

// of returns w's baggage header value.
func (c *baggageCache) of(w *state.Workload) string {
	if e := c.last.Load(); e != nil && e.w == w {
		return e.val
	}
	e := &baggageEntry{w: w, val: baggageOf(w).String()}
	c.last.Store(e)
	return e.val
}

// baggageOf describes w with ztunnel's baggage keys.
func baggageOf(w *state.Workload) meta.Baggage {
	name := w.WorkloadName
	if name == "" {
		name = w.Name
	}
	kind := w.WorkloadType
	if kind == "" {
		kind = "deployment" // the workload API's default kind
	}
	return meta.Baggage{
		ClusterID: w.ClusterID, Namespace: w.Namespace, WorkloadType: kind, WorkloadName: name,
		ServiceName: w.CanonicalName, ServiceVersion: w.CanonicalRevision,
		Region: w.Locality.Region, Zone: w.Locality.Zone,
	}
}

// connectHeader is the metadata an outbound CONNECT carries: who the
// client is (forwarded), the source workload (baggage) and a new trace.
func (p *Proxy) connectHeader(src *state.Workload, client netip.AddrPort) http.Header {
	hdr := make(http.Header, 3)
	hdr["Forwarded"] = []string{meta.ForwardedElement{For: client.String()}.String()}
	if b := p.baggage.of(src); b != "" {
		hdr["Baggage"] = []string{b}
	}
	hdr["Traceparent"] = []string{meta.NewTraceParent().String()}
	return hdr
}

// responseHeader is what a 200 to a CONNECT carries: our workload's baggage.
func (p *Proxy) responseHeader(w *state.Workload) http.Header {
	if w == nil {
		return nil
	}
	b := p.baggage.of(w)
	if b == "" {
		return nil
	}
	return http.Header{"Baggage": []string{b}}
}

// inboundMeta reads a CONNECT's metadata for telemetry, before the request
// is authorized: the destination service named by Forwarded host=, and the
// source described by baggage when the request crossed a network gateway
// (x-forwarded-network differs from ours), where the peer address is the
// gateway's. Unparsable values are ignored: they only label telemetry.
func (p *Proxy) inboundMeta(req *hbone.ServerRequest, ci *connInfo) {
	if v := req.Header.Values("Forwarded"); len(v) > 0 {
		if host := forwardedHost(v); host != "" {
			snap := p.cfg.State.Load()
			if w := snap.FindWorkload(p.info); w != nil {
				ci.service = serviceOfWorkload(snap, w, host)
			}
		}
	}
	if nw := req.Header.Get("X-Forwarded-Network"); nw != "" && nw != p.cfg.Network {
		if b, err := meta.ParseBaggage(joinValues(req.Header.Values("Baggage"))); err == nil && b != (meta.Baggage{}) {
			ci.srcWorkload, ci.srcFromBaggage = workloadFromBaggage(b, nw), true
		}
	}
}

// forwardedHost returns the host= of the last hop that names one: the
// hop nearest to us, which is the one a waypoint or client added.
func forwardedHost(values []string) string {
	elems, err := meta.ParseForwarded(joinValues(values))
	if err != nil {
		return ""
	}
	for i := len(elems) - 1; i >= 0; i-- {
		if elems[i].Host != "" {
			return elems[i].Host
		}
	}
	return ""
}

func joinValues(v []string) string {
	switch len(v) {
	case 0:
		return ""
	case 1:
		return v[0]
	}
	s := v[0]
	for _, x := range v[1:] {
		s += "," + x
	}
	return s
}

// serviceOfWorkload returns the service with hostname host among the
// services w belongs to. The peer's claim is only believed within that
// bounded set, so it cannot label metrics with an arbitrary service.
func serviceOfWorkload(snap *state.Snapshot, w *state.Workload, host string) *state.Service {
	for _, svc := range snap.ServicesByHostname(host) {
		if _, ok := w.Services[svc.Key()]; ok {
			return svc
		}
	}
	return nil
}

// workloadFromBaggage stands for a source known only by its baggage.
func workloadFromBaggage(b meta.Baggage, network string) *state.Workload {
	return &state.Workload{
		Name: b.WorkloadName, WorkloadName: b.WorkloadName, WorkloadType: b.WorkloadType,
		Namespace: b.Namespace, ClusterID: b.ClusterID, Network: network,
		CanonicalName: b.ServiceName, CanonicalRevision: b.ServiceVersion,
		Locality: state.Locality{Region: b.Region, Zone: b.Zone},
	}
}
