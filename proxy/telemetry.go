package proxy

import (
	"net/netip"
	"strings"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/proxy/meta"
	"github.com/ztunnel-go/ztunnel/state"
)

// Telemetry of a connection as ztunnel reports it: the label set of its
// metrics (ztunnel's ConnectionOpen into CommonTrafficLabels), and the
// access-log fields, which ztunnel derives from the same labels.

// Outbound protocols, as ztunnel's connection dump names them.
const (
	protoTCP        = "TCP"
	protoHBONE      = "HBONE"
	protoDoubleHBON = "DOUBLEHBONE"
)

// connExt holds what only some connections need, so the record every idle
// relayed connection keeps (conn) stays in its size class: a
// passthrough connection has none.
type connExt struct {
	// hboneAddr is the CONNECT authority (dst.hbone_addr).
	hboneAddr string
	// origDst is, outbound, the destination the app asked for when the
	// connection went elsewhere (an endpoint of a VIP, a waypoint, a
	// gateway): the connections dump's originalDst. Zero: dst.
	origDst netip.AddrPort
	// arrivedOn is, inbound over HBONE, the address the tunnel arrived on
	// (the pod's ip:15008): dst.addr of the access log, as ztunnel logs it.
	arrivedOn netip.AddrPort
	// forHost is, inbound, the Forwarded host= the client named (ztunnel's
	// for_host: the connections dump's originalDst, and the service the
	// destination believes first).
	forHost string
	// baggage is the peer's baggage: inbound, the client's (its derived
	// source); outbound double HBONE, the destination's from the inner
	// response (its derived destination).
	baggage string
	// peerID is, outbound double HBONE, the identity the inner TLS peer
	// proved (the derived destination's principal).
	peerID *identity.Identity
	// hasBaggage says baggage applies even when empty: a double HBONE
	// destination is always derived from the inner response, as ztunnel.
	hasBaggage bool
	// double says the outbound connection is double HBONE.
	double bool
}

// extOf returns c's connExt, making it on first use.
func (c *conn) extOf() *connExt {
	if c.ext == nil {
		c.ext = new(connExt)
	}
	return c.ext
}

// hboneAddr is the CONNECT authority, "" without one.
func (c *conn) hboneAddr() string {
	if c.ext == nil {
		return ""
	}
	return c.ext.hboneAddr
}

// logDst is dst.addr of the access log: outbound the address dialled (an
// endpoint's ip:15008, a waypoint, a gateway), inbound over HBONE the
// address the tunnel arrived on, inbound plaintext the original
// destination.
func (c *conn) logDst() netip.AddrPort {
	if c.ext != nil && c.ext.arrivedOn.IsValid() {
		return c.ext.arrivedOn
	}
	return c.dst
}

// origDst is the destination the app asked for (outbound).
func (c *conn) origDst() netip.AddrPort {
	if c.ext != nil && c.ext.origDst.IsValid() {
		return c.ext.origDst
	}
	return c.dst
}

// protocol is the connection's protocol as ztunnel's connection dump
// spells it: TCP, HBONE or (outbound) DOUBLEHBONE.
func (c *conn) protocol() string {
	switch {
	case c.ext != nil && c.ext.double:
		return protoDoubleHBON
	case c.mtls:
		return protoHBONE
	}
	return protoTCP
}

// peerFromBaggage is what a baggage value says about a workload, with the
// identity its TLS handshake proved (ztunnel's DerivedWorkload). A value
// that does not parse says nothing, as ztunnel's lenient parser would.
func peerFromBaggage(v string, id identity.Identity) *metrics.Peer {
	p := &metrics.Peer{}
	if !id.IsZero() {
		p.Identity = id.String()
	}
	if v == "" {
		return p
	}
	b, err := meta.ParseBaggage(v)
	if err != nil {
		return p
	}
	p.WorkloadName, p.App, p.Revision, p.Namespace = b.WorkloadName, b.ServiceName, b.ServiceVersion, b.Namespace
	p.ClusterID, p.Region, p.Zone = b.ClusterID, b.Region, b.Zone
	return p
}

// labels is the connection's metric label set, by ztunnel's rules: the
// derived source (the identity mTLS proved, and inbound what the client's
// baggage says) first, then the source workload's record, which overrides
// all but the principal; the destination workload's record, or for double
// HBONE what the destination's response said; the intended service.
func (c *conn) labels() metrics.ConnLabels {
	l := metrics.ConnLabels{Reporter: c.reporter(), SecurityPolicy: metrics.SecurityUnknown}
	if c.mtls {
		l.SecurityPolicy = metrics.SecurityMutualTLS
	}
	switch {
	case c.inbound && c.mtls:
		var bg string
		if c.ext != nil {
			bg = c.ext.baggage
		}
		l.SetPeerSource(peerFromBaggage(bg, c.srcID()))
	case c.mtls:
		l.SetPeerSource(&metrics.Peer{Identity: c.srcID().String()})
	}
	if c.srcWorkload != nil {
		l.SetSource(metricsWorkload(c.srcWorkload, c.srcWorkload.Identity()))
	}
	if c.dstWorkload != nil {
		l.SetDestination(metricsWorkload(c.dstWorkload, c.p.router.identityOf(c.dstWorkload)))
	}
	if e := c.ext; !c.inbound && e != nil && e.hasBaggage {
		var id identity.Identity
		if e.peerID != nil {
			id = *e.peerID
		}
		l.SetPeerDestination(peerFromBaggage(e.baggage, id))
	}
	if c.service != nil {
		l.SetDestinationService(c.service.Hostname, c.service.Name, c.service.Namespace)
	}
	return l
}

// logNames are src.workload and dst.workload of the access log, as ztunnel
// names them: the pod name of a known workload, else the canonical
// service the labels carry; a double HBONE destination by the workload
// name its response gave.
func (c *conn) logNames(l *metrics.ConnLabels) (src, dst string) {
	src = l.SourceCanonicalService
	if c.srcWorkload != nil {
		src = c.srcWorkload.Name
	}
	dst = l.DestinationCanonicalService
	if c.dstWorkload != nil {
		dst = c.dstWorkload.Name
	}
	if e := c.ext; !c.inbound && e != nil && e.hasBaggage {
		dst = l.DestinationWorkload
	}
	return src, dst
}

// parseForwardedHost is ztunnel's parse_forwarded_host: the value of the
// first ';'-separated part of the header that starts with host=, without
// surrounding quotes; "" when there is none or the header is not ASCII.
func parseForwardedHost(v string) string {
	for i := 0; i < len(v); i++ {
		if v[i] >= 0x80 {
			return ""
		}
	}
	for part := range strings.SplitSeq(v, ";") {
		part = strings.TrimSpace(part)
		h, ok := strings.CutPrefix(part, "host=")
		if !ok {
			continue
		}
		h = strings.TrimPrefix(h, `"`)
		h = strings.TrimSuffix(h, `"`)
		return h
	}
	return ""
}

// servicesOfWorkload lists the services w is an endpoint of, in key order
// (ztunnel's get_services_by_workload, which follows the workload's list).
func servicesOfWorkload(snap *state.Snapshot, w *state.Workload) []*state.Service {
	out := make([]*state.Service, 0, w.Services.Len())
	for _, sp := range w.Services.List() { // sorted by key
		if svc := snap.ServiceByKey(sp.Key); svc != nil {
			out = append(out, svc)
		}
	}
	return out
}

// guessInboundService is ztunnel's guess_inbound_service: among the
// services the connection may be for (the one a hostname authority named,
// else every service of the destination workload w), the one the client
// named in Forwarded host=; else the first whose target port, or w's own
// port for it, is the port dialled. The client's claim is believed only
// within that bounded set, so it cannot label metrics with an arbitrary
// service.
func guessInboundService(candidates []*state.Service, forHost string, w *state.Workload, dport uint16) *state.Service {
	if forHost != "" {
		for _, svc := range candidates {
			if svc.Hostname == forHost {
				return svc
			}
		}
	}
	for _, svc := range candidates {
		own, _ := w.Services.Ports(svc.Key())
		for sport, tport := range svc.Ports {
			if otport, _ := own.Target(sport); tport == dport || otport == dport {
				return svc
			}
		}
	}
	return nil
}

// inboundCandidates are the services an inbound connection to w may be
// for: the one a hostname authority names (double HBONE), else all of w's.
func inboundCandidates(snap *state.Snapshot, w *state.Workload, host string) []*state.Service {
	if host == "" {
		return servicesOfWorkload(snap, w)
	}
	for _, svc := range snap.ServicesByHostname(host) {
		if w.Services.Has(svc.Key()) {
			return []*state.Service{svc}
		}
	}
	return nil
}

// appPort is the port an inbound connection to w's port is dialled on: an
// application tunnel may name its own (ztunnel matches services against
// that port).
func appPort(w *state.Workload, port uint16) uint16 {
	if t := w.ApplicationTunnel(); t != nil && t.Port != 0 {
		return t.Port
	}
	return port
}

// Connection is one open connection of a proxy as ztunnel's connection
// manager dumps it (istioctl ztunnel-config connections).
type Connection struct {
	// Inbound says the connection came to the workload (else from it).
	Inbound bool
	// Src is the client's address.
	Src netip.AddrPort
	// OriginalDst is, outbound, the destination the app asked for.
	OriginalDst netip.AddrPort
	// ForHost is, inbound, the service the client named in Forwarded
	// host= (ztunnel's originalDst of an inbound connection); "" = none.
	ForHost string
	// ActualDst is, outbound, the address dialled (an endpoint's
	// ip:15008, a waypoint, a gateway); inbound, the app's address.
	ActualDst netip.AddrPort
	// Protocol is TCP, HBONE or (outbound) DOUBLEHBONE.
	Protocol string
}

// Connections lists the proxy's relayed connections: outbound ones, and
// inbound ones (authorized, HBONE or plaintext).
func (p *Proxy) Connections() []Connection {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Connection, 0, len(p.relays))
	for _, cn := range p.relays {
		c := Connection{Inbound: cn.inbound, Src: cn.src, ActualDst: cn.dst, Protocol: cn.protocol()}
		if cn.inbound {
			if cn.ext != nil {
				c.ForHost = cn.ext.forHost
			}
		} else {
			c.OriginalDst = cn.origDst()
		}
		out = append(out, c)
	}
	return out
}
