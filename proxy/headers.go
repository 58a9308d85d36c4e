package proxy

import (
	"net/http"
	"net/netip"
	"strings"
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
	name := w.WorkloadName()
	if name == "" {
		name = w.Name
	}
	kind := w.WorkloadType()
	if kind == "" {
		kind = "deployment" // the workload API's default kind
	}
	return meta.Baggage{
		ClusterID: w.ClusterID(), Namespace: w.Namespace(), WorkloadType: kind, WorkloadName: name,
		ServiceName: w.CanonicalName(), ServiceVersion: w.CanonicalRevision(),
		Region: w.Locality().Region, Zone: w.Locality().Zone,
	}
}

// connectHeader is the metadata an outbound CONNECT carries, as ztunnel
// sends it: who the client is and, when the connection is for a service,
// which one (Forwarded for="ip:port";host=svc-hostname: the destination
// attributes the connection to that service), the source workload
// (baggage) and a new trace.
func (p *Proxy) connectHeader(src *state.Workload, client netip.AddrPort, svc *state.Service) http.Header {
	hdr := make(http.Header, 4)
	fwd := meta.ForwardedElement{For: client.String()}.String()
	if svc != nil {
		// ztunnel writes the hostname as is (a DNS name is a token).
		fwd += ";host=" + svc.Hostname
	}
	hdr["Forwarded"] = []string{fwd}
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
// is authorized, as ztunnel does: the authority (dst.hbone_addr), the
// address the tunnel arrived on (dst.addr), the service the client named
// in Forwarded host= and the client's baggage (its derived source). They
// only label telemetry: the service is believed only among the
// destination's own (guessInboundService) and the principal only from the
// TLS handshake.
func (c *conn) inboundMeta(req *hbone.ServerRequest) {
	e := c.extOf()
	e.hboneAddr = req.Authority
	e.arrivedOn = addrPortOf(req.Conn.LocalAddr())
	e.forHost = parseForwardedHost(req.Header.Get("Forwarded"))
	if v := req.Header.Values("Baggage"); len(v) > 0 {
		e.baggage = strings.Join(v, ",")
	}
}
