package metrics

import (
	"encoding/binary"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Reporter is the side of a connection that reports it: the client's proxy
// (outbound) or the server's (inbound).
type Reporter uint8

// Reporters, as the reporter label spells them.
const (
	ReporterSource      Reporter = iota // outbound: "source"
	ReporterDestination                 // inbound: "destination"
)

func (r Reporter) String() string {
	if r == ReporterDestination {
		return "destination"
	}
	return "source"
}

// ResponseFlags says why a connection failed; FlagNone ("-") when it did
// not. Only istio_tcp_connections_closed_total and _failed_total carry a
// flag other than "-": the opened and byte counters are keyed at open,
// before the outcome is known, as in ztunnel.
type ResponseFlags uint8

// Response flags, as the response_flags label spells them.
const (
	FlagNone               ResponseFlags = iota // "-"
	FlagDeny                                    // "DENY": authorization policy
	FlagConnect                                 // "CONNECT": upstream connection failed
	FlagTLSFailure                              // "TLS_FAILURE"
	FlagH2HandshakeFailure                      // "H2_HANDSHAKE_FAILURE"
	FlagNetworkPolicy                           // "NETWORK_POLICY": HBONE port unreachable
	FlagIdentityError                           // "IDENTITY_ERROR": no certificate
	FlagCertRevoked                             // "CERT_REVOKED": peer certificate revoked by a CRL
	numFlags
)

var flagNames = [numFlags]string{"-", "DENY", "CONNECT", "TLS_FAILURE", "H2_HANDSHAKE_FAILURE", "NETWORK_POLICY", "IDENTITY_ERROR", "CERT_REVOKED"}

func (f ResponseFlags) String() string {
	if f >= numFlags {
		return flagNames[FlagConnect]
	}
	return flagNames[f]
}

// SecurityPolicy is connection_security_policy: mutual_tls for HBONE, unknown
// for plain TCP (outbound passthrough, inbound plaintext).
type SecurityPolicy uint8

// Security policies.
const (
	SecurityUnknown   SecurityPolicy = iota // "unknown"
	SecurityMutualTLS                       // "mutual_tls"
)

func (p SecurityPolicy) String() string {
	if p == SecurityMutualTLS {
		return "mutual_tls"
	}
	return "unknown"
}

// ConnLabels is the label set of the istio_tcp_* families except
// response_flags (ztunnel's CommonTrafficLabels). Empty strings are exposed
// as "unknown"; request_protocol is always "tcp". Fill it with the Set*
// methods, which apply ztunnel's rules, or field by field.
//
// The locality labels (source_region, ...) are always exposed: ztunnel
// exposes them whenever a source or destination workload is known, which
// is every connection it counts.
type ConnLabels struct {
	Reporter       Reporter
	SecurityPolicy SecurityPolicy

	SourceWorkload          string
	SourceCanonicalService  string
	SourceCanonicalRevision string
	SourceWorkloadNamespace string
	SourcePrincipal         string // SPIFFE URI, only from the peer's mTLS identity
	SourceApp               string
	SourceVersion           string
	SourceCluster           string
	SourceRegion            string
	SourceZone              string

	DestinationService          string // hostname
	DestinationServiceNamespace string
	DestinationServiceName      string

	DestinationWorkload          string
	DestinationCanonicalService  string
	DestinationCanonicalRevision string
	DestinationWorkloadNamespace string
	DestinationPrincipal         string // SPIFFE URI
	DestinationApp               string
	DestinationVersion           string
	DestinationCluster           string
	DestinationRegion            string
	DestinationZone              string
}

// Workload is a workload record as the traffic labels see it.
type Workload struct {
	WorkloadName      string // the owning workload (deployment), not the pod
	CanonicalName     string
	CanonicalRevision string
	Namespace         string
	Identity          string // SPIFFE URI
	ClusterID         string
	Region, Zone      string
}

// Peer is what a peer said about itself rather than what the control plane
// knows: its mTLS identity and, with baggage, its workload.
type Peer struct {
	WorkloadName string
	App          string
	Revision     string
	Namespace    string
	Identity     string // SPIFFE URI from the TLS handshake
	ClusterID    string
	Region, Zone string
}

// SetPeerSource fills the source labels from what the peer said. Call it
// before SetSource: a known workload record overrides everything but the
// principal, which only the handshake proves.
func (l *ConnLabels) SetPeerSource(p *Peer) { setEnd(l.source(), peerEnd(p), true) }

// SetSource fills the source labels from the source workload's record. It
// leaves SourcePrincipal alone: ztunnel reports a source principal only
// when mTLS proved it (SetPeerSource).
func (l *ConnLabels) SetSource(w *Workload) { setEnd(l.source(), workloadEnd(w), false) }

// SetDestination fills the destination labels from the destination
// workload's record, principal included.
func (l *ConnLabels) SetDestination(w *Workload) { setEnd(l.destination(), workloadEnd(w), true) }

// SetPeerDestination fills the destination labels from what the peer said
// (a destination known only by its handshake and baggage).
func (l *ConnLabels) SetPeerDestination(p *Peer) { setEnd(l.destination(), peerEnd(p), true) }

// The labels of one end of a connection (source or destination), in the
// order an end value and the source and destination methods list them.
const (
	endWorkload = iota
	endCanonicalService
	endCanonicalRevision
	endNamespace
	endPrincipal
	endApp
	endVersion
	endCluster
	endRegion
	endZone
	numEnd
)

// end is the values of one end's labels: the four Set methods differ only
// in which end they fill and where its values come from.
type end [numEnd]string

// workloadEnd is what a workload record says: app and version are its
// canonical name and revision, as ztunnel reports them.
func workloadEnd(w *Workload) end {
	return end{w.WorkloadName, w.CanonicalName, w.CanonicalRevision, w.Namespace, w.Identity,
		w.CanonicalName, w.CanonicalRevision, w.ClusterID, w.Region, w.Zone}
}

// peerEnd is what a peer said: app is its workload name, version its
// revision, as ztunnel reports them.
func peerEnd(p *Peer) end {
	return end{p.WorkloadName, p.App, p.Revision, p.Namespace, p.Identity,
		p.WorkloadName, p.Revision, p.ClusterID, p.Region, p.Zone}
}

// source and destination return the fields of one end's labels, in end order.
func (l *ConnLabels) source() [numEnd]*string {
	return [numEnd]*string{&l.SourceWorkload, &l.SourceCanonicalService, &l.SourceCanonicalRevision,
		&l.SourceWorkloadNamespace, &l.SourcePrincipal, &l.SourceApp, &l.SourceVersion, &l.SourceCluster,
		&l.SourceRegion, &l.SourceZone}
}

func (l *ConnLabels) destination() [numEnd]*string {
	return [numEnd]*string{&l.DestinationWorkload, &l.DestinationCanonicalService, &l.DestinationCanonicalRevision,
		&l.DestinationWorkloadNamespace, &l.DestinationPrincipal, &l.DestinationApp, &l.DestinationVersion,
		&l.DestinationCluster, &l.DestinationRegion, &l.DestinationZone}
}

// setEnd stores v into the fields of dst, the principal only if principal.
func setEnd(dst [numEnd]*string, v end, principal bool) {
	for i, f := range dst {
		if i != endPrincipal || principal {
			*f = v[i]
		}
	}
}

// SetDestinationService fills destination_service (the hostname),
// destination_service_name and destination_service_namespace.
func (l *ConnLabels) SetDestinationService(hostname, name, namespace string) {
	l.DestinationService = hostname
	l.DestinationServiceName = name
	l.DestinationServiceNamespace = namespace
}

// trafficLabelNames is the label set of the istio_tcp_* families in
// ztunnel's order; labelValues follows it.
var trafficLabelNames = []string{
	"reporter",
	"source_workload", "source_canonical_service", "source_canonical_revision", "source_workload_namespace",
	"source_principal", "source_app", "source_version", "source_cluster",
	"destination_service", "destination_service_namespace", "destination_service_name",
	"destination_workload", "destination_canonical_service", "destination_canonical_revision",
	"destination_workload_namespace", "destination_principal", "destination_app", "destination_version",
	"destination_cluster",
	"request_protocol", "response_flags", "connection_security_policy",
	"source_region", "source_zone", "destination_region", "destination_zone",
}

const flagsLabel = 21 // index of response_flags in trafficLabelNames

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func (l *ConnLabels) labelValues() []string {
	return []string{
		l.Reporter.String(),
		orUnknown(l.SourceWorkload), orUnknown(l.SourceCanonicalService), orUnknown(l.SourceCanonicalRevision),
		orUnknown(l.SourceWorkloadNamespace), orUnknown(l.SourcePrincipal), orUnknown(l.SourceApp),
		orUnknown(l.SourceVersion), orUnknown(l.SourceCluster),
		orUnknown(l.DestinationService), orUnknown(l.DestinationServiceNamespace), orUnknown(l.DestinationServiceName),
		orUnknown(l.DestinationWorkload), orUnknown(l.DestinationCanonicalService), orUnknown(l.DestinationCanonicalRevision),
		orUnknown(l.DestinationWorkloadNamespace), orUnknown(l.DestinationPrincipal), orUnknown(l.DestinationApp),
		orUnknown(l.DestinationVersion), orUnknown(l.DestinationCluster),
		"tcp", FlagNone.String(), l.SecurityPolicy.String(),
		orUnknown(l.SourceRegion), orUnknown(l.SourceZone), orUnknown(l.DestinationRegion), orUnknown(l.DestinationZone),
	}
}

// The traffic families, indexes into traffic.names and traffic.help.
const (
	famOpened = iota
	famClosed
	famFailed
	famReceived
	famSent
	numFams
)

// traffic holds the istio_tcp_* counter families. A series per label set
// holds its open connections' counters and the totals of its closed ones;
// a scrape adds them up.
type traffic struct {
	names, help [numFams]string
	// sorted is the permutation of trafficLabelNames into name order, the
	// order a dto.Metric's labels must be in.
	sorted []int

	mu       sync.RWMutex       // guards the following fields
	byLabels map[string]*series // by ConnLabels.appendKey
	all      []*series          // append-only, so a scrape can copy the header and let go
}

func newTraffic() *traffic {
	t := &traffic{byLabels: make(map[string]*series)}
	t.names = [numFams]string{
		famOpened:   "istio_tcp_connections_opened_total",
		famClosed:   "istio_tcp_connections_closed_total",
		famFailed:   "istio_tcp_connections_failed_total",
		famReceived: "istio_tcp_received_bytes_total",
		famSent:     "istio_tcp_sent_bytes_total",
	}
	t.help = [numFams]string{
		famOpened:   "Total TCP connections opened.",
		famClosed:   "Total TCP connections closed.",
		famFailed:   "Total TCP connections that failed (unstable).",
		famReceived: "Bytes received from the client side of TCP connections (request direction).",
		famSent:     "Bytes sent back to the client side of TCP connections (response direction).",
	}
	t.sorted = make([]int, len(trafficLabelNames))
	for i := range t.sorted {
		t.sorted[i] = i
	}
	sort.Slice(t.sorted, func(a, b int) bool { return trafficLabelNames[t.sorted[a]] < trafficLabelNames[t.sorted[b]] })
	return t
}

// series is one label set's state.
type series struct {
	mu sync.Mutex // guards the following fields
	// pairs are the sorted label pairs per response flag: [FlagNone] is set
	// at creation, the others the first time a scrape needs them.
	pairs    [numFlags][]*dto.LabelPair
	opened   uint64
	closed   [numFlags]uint64
	doneRecv uint64 // bytes of closed connections
	doneSent uint64
	live     []*Conn // open connections; Conn.idx is the position
}

// appendKey appends an unambiguous encoding of l (each string length
// prefixed). Hashing one flat key costs a fraction of hashing the struct
// field by field, and the lookup m[string(key)] does not allocate.
func (l *ConnLabels) appendKey(b []byte) []byte {
	b = append(b, byte(l.Reporter), byte(l.SecurityPolicy))
	for _, s := range [...]string{
		l.SourceWorkload, l.SourceCanonicalService, l.SourceCanonicalRevision, l.SourceWorkloadNamespace,
		l.SourcePrincipal, l.SourceApp, l.SourceVersion, l.SourceCluster, l.SourceRegion, l.SourceZone,
		l.DestinationService, l.DestinationServiceNamespace, l.DestinationServiceName,
		l.DestinationWorkload, l.DestinationCanonicalService, l.DestinationCanonicalRevision,
		l.DestinationWorkloadNamespace, l.DestinationPrincipal, l.DestinationApp, l.DestinationVersion,
		l.DestinationCluster, l.DestinationRegion, l.DestinationZone,
	} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

func (t *traffic) seriesFor(l *ConnLabels) *series {
	var buf [512]byte
	key := l.appendKey(buf[:0])
	t.mu.RLock()
	s := t.byLabels[string(key)]
	t.mu.RUnlock()
	if s != nil {
		return s
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s = t.byLabels[string(key)]; s == nil {
		s = &series{}
		vals := l.labelValues()
		pairs := make([]*dto.LabelPair, len(t.sorted))
		for i, idx := range t.sorted {
			pairs[i] = &dto.LabelPair{Name: &trafficLabelNames[idx], Value: &vals[idx]}
		}
		s.pairs[FlagNone] = pairs
		t.byLabels[string(key)] = s
		t.all = append(t.all, s)
	}
	return s
}

// pairsLocked returns the label pairs for flag f, building them from the
// FlagNone ones the first time a connection closes with f.
func (t *traffic) pairsLocked(s *series, f ResponseFlags) []*dto.LabelPair {
	if p := s.pairs[f]; p != nil {
		return p
	}
	p := append([]*dto.LabelPair(nil), s.pairs[FlagNone]...)
	for i, idx := range t.sorted {
		if idx == flagsLabel {
			p[i] = &dto.LabelPair{Name: &trafficLabelNames[flagsLabel], Value: &flagNames[f]}
		}
	}
	s.pairs[f] = p
	return p
}

// Conn is one open connection's registration, returned by ConnOpened. Its
// owner calls Closed exactly once, after the last byte was counted.
type Conn struct {
	s              *series
	received, sent *atomic.Int64
	idx            int // position in s.live; guarded by s.mu
}

// noBytes stands in for a counter the caller does not have; it is only read.
var noBytes atomic.Int64

// ConnOpened counts a connection opened with labels l and registers its
// byte counters: received counts bytes from the client towards the server
// (istio_tcp_received_bytes_total), sent the bytes back to the client
// (istio_tcp_sent_bytes_total), for either reporter. The connection's
// owner keeps adding to them as bytes flow; scrapes read them, so a long
// connection shows its progress. l is copied; nil counters count nothing.
//
// The label set is looked up once here, under a read lock (a write lock
// the first time it is seen). On a nil *Metrics it returns nil, and
// (*Conn)(nil).Closed does nothing.
func (m *Metrics) ConnOpened(l *ConnLabels, received, sent *atomic.Int64) *Conn {
	if m == nil {
		return nil
	}
	if received == nil {
		received = &noBytes
	}
	if sent == nil {
		sent = &noBytes
	}
	s := m.traffic.seriesFor(l)
	c := &Conn{s: s, received: received, sent: sent}
	s.mu.Lock()
	s.opened++
	c.idx = len(s.live)
	s.live = append(s.live, c)
	s.mu.Unlock()
	return c
}

// Closed counts the connection closed with flags (FlagNone when it ended
// well; anything else also counts it in istio_tcp_connections_failed_total)
// and folds its byte counts into its label set's totals. Later calls do
// nothing; the counters are not read again.
func (c *Conn) Closed(flags ResponseFlags) {
	if c == nil || c.s == nil {
		return
	}
	if flags >= numFlags {
		flags = FlagConnect
	}
	s := c.s
	s.mu.Lock()
	s.closed[flags]++
	s.doneRecv += uint64(c.received.Load())
	s.doneSent += uint64(c.sent.Load())
	last := len(s.live) - 1
	if c.idx != last {
		moved := s.live[last]
		s.live[c.idx] = moved
		moved.idx = c.idx
	}
	s.live[last] = nil
	s.live = s.live[:last]
	c.s = nil
	s.mu.Unlock()
}

// gather builds the traffic families directly: for each label set, the
// closed totals plus the live counters, read under the series lock so
// that a connection closing during the scrape is counted exactly once.
// It bypasses the registry's per-sample checks and sorting, which cost
// tens of milliseconds per scrape at 10k label sets; the samples are
// correct by construction (the tests run them through the text parser).
func (t *traffic) gather() []*dto.MetricFamily {
	t.mu.RLock()
	all := t.all
	t.mu.RUnlock()
	var fams [numFams]*dto.MetricFamily
	counter := dto.MetricType_COUNTER
	for i := range fams {
		fams[i] = &dto.MetricFamily{Name: &t.names[i], Help: &t.help[i], Type: &counter}
		if i != famClosed && i != famFailed {
			fams[i].Metric = make([]*dto.Metric, 0, len(all))
		}
	}
	var vals [numFams + 2*numFlags]struct {
		fam   int
		pairs []*dto.LabelPair
		value float64
	}
	for _, s := range all {
		n := 0
		add := func(fam int, pairs []*dto.LabelPair, v uint64) {
			vals[n].fam, vals[n].pairs, vals[n].value = fam, pairs, float64(v)
			n++
		}
		s.mu.Lock()
		recv, sent := s.doneRecv, s.doneSent
		for _, c := range s.live {
			recv += uint64(c.received.Load())
			sent += uint64(c.sent.Load())
		}
		none := s.pairs[FlagNone]
		add(famOpened, none, s.opened)
		add(famReceived, none, recv)
		add(famSent, none, sent)
		for f := ResponseFlags(0); f < numFlags; f++ {
			if c := s.closed[f]; c > 0 {
				p := t.pairsLocked(s, f)
				add(famClosed, p, c)
				if f != FlagNone {
					add(famFailed, p, c)
				}
			}
		}
		s.mu.Unlock()
		// Three allocations per label set, whatever the number of samples.
		ms := make([]dto.Metric, n)
		cs := make([]dto.Counter, n)
		vs := make([]float64, n)
		for i := range n {
			vs[i] = vals[i].value
			cs[i].Value = &vs[i]
			ms[i].Label = vals[i].pairs
			ms[i].Counter = &cs[i]
			fams[vals[i].fam].Metric = append(fams[vals[i].fam].Metric, &ms[i])
		}
	}
	out := make([]*dto.MetricFamily, 0, numFams)
	for _, f := range fams {
		if len(f.Metric) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// gatherer exposes the registry's families and the traffic families
// together, sorted by name as a registry would.
type gatherer struct {
	reg     *prometheus.Registry
	traffic *traffic
}

func (g gatherer) Gather() ([]*dto.MetricFamily, error) {
	fams, err := g.reg.Gather()
	fams = append(fams, g.traffic.gather()...)
	slices.SortFunc(fams, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return fams, err
}
