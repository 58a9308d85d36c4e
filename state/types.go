package state

import (
	"net/netip"
	"strconv"

	"github.com/ztunnel-go/ztunnel/identity"
)

// Protocol is the tunnel protocol a workload accepts inbound traffic with
// (istio.workload.TunnelProtocol; LEGACY_ISTIO_MTLS is rejected at conversion).
type Protocol uint8

const (
	// ProtocolTCP is plain TCP to the workload's port (NONE on the wire).
	ProtocolTCP Protocol = iota
	// ProtocolHBONE is HTTP/2 CONNECT over mTLS to the workload's port 15008.
	ProtocolHBONE
)

// String returns the name ztunnel uses in its config and config dump.
func (p Protocol) String() string {
	return enumName(p, "Protocol", "TCP", "HBONE")
}

// enumName returns the name of v, names[v], for the enums of this package
// (each numbered from 0 by iota, in the order of names), or "typ(v)" for a
// value names does not list.
func enumName[T ~uint8](v T, typ string, names ...string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return typ + "(" + strconv.Itoa(int(v)) + ")"
}

// HealthStatus is a workload's health as the control plane reports it.
type HealthStatus uint8

const (
	// Healthy workloads receive service traffic.
	Healthy HealthStatus = iota
	// Unhealthy workloads are left out of service endpoints unless the
	// service's load balancer health policy is AllowAll.
	Unhealthy
)

// String returns "Healthy" or "Unhealthy".
func (h HealthStatus) String() string {
	return enumName(h, "HealthStatus", "Healthy", "Unhealthy")
}

// NetworkMode says whether a workload shares its node's network namespace.
type NetworkMode uint8

const (
	// NetworkModeStandard is a workload with its own addresses.
	NetworkModeStandard NetworkMode = iota
	// NetworkModeHostNetwork is a workload that uses its node's addresses;
	// such workloads are not indexed by address, since the address names the
	// node rather than the workload.
	NetworkModeHostNetwork
)

// String returns "Standard" or "HostNetwork".
func (m NetworkMode) String() string {
	return enumName(m, "NetworkMode", "Standard", "HostNetwork")
}

// NetworkAddress is an IP address qualified by the network it is reachable
// on; the same IP on two networks names two different things.
type NetworkAddress struct {
	Network string
	Addr    netip.Addr
}

// String returns "network/ip", the form used in config and xDS keys.
func (a NetworkAddress) String() string { return a.Network + "/" + a.Addr.String() }

// NetworkPrefix is a CIDR qualified by its network (a service's CIDR VIP).
type NetworkPrefix struct {
	Network string
	Prefix  netip.Prefix
}

// String returns "network/cidr".
func (p NetworkPrefix) String() string { return p.Network + "/" + p.Prefix.String() }

// NamespacedHostname names a service: its namespace and hostname.
type NamespacedHostname struct {
	Namespace, Hostname string
}

// String returns "namespace/hostname", the service key.
func (n NamespacedHostname) String() string { return n.Namespace + "/" + n.Hostname }

// GatewayAddress locates a waypoint or network gateway: exactly one of
// Hostname (a service) or Address is set. It is parsed and kept; routing
// through waypoints and gateways is a later step.
type GatewayAddress struct {
	Hostname      *NamespacedHostname
	Address       *NetworkAddress
	HBONEMTLSPort uint16
}

// Destination returns the gateway's destination in ztunnel's config-dump form:
// "network/ip" for an address, "namespace/hostname" for a hostname.
func (g *GatewayAddress) Destination() string {
	switch {
	case g.Address != nil:
		return g.Address.String()
	case g.Hostname != nil:
		return g.Hostname.String()
	}
	return ""
}

// AppTunnelProtocol is how traffic is handed to a workload that terminates
// tunnels itself (istio.workload.ApplicationTunnel.Protocol).
type AppTunnelProtocol uint8

const (
	// AppTunnelNone sends plain bytes.
	AppTunnelNone AppTunnelProtocol = iota
	// AppTunnelProxy prefixes the stream with a PROXY protocol v2 header.
	AppTunnelProxy
)

// String returns "NONE" or "PROXY", ztunnel's spelling.
func (p AppTunnelProtocol) String() string {
	return enumName(p, "AppTunnelProtocol", "NONE", "PROXY")
}

// ApplicationTunnel describes a workload that accepts tunneled traffic itself.
type ApplicationTunnel struct {
	Protocol AppTunnelProtocol
	// Port receives the tunnel; 0 means the connection's own target port.
	Port uint16
}

// Locality places a workload for locality-aware load balancing.
type Locality struct {
	Region, Zone, Subzone string
}

// Workload is one addressable workload (pod, VM, ...). Values reachable from a
// Snapshot are shared and must not be modified.
type Workload struct {
	UID  string
	Name string

	// Labels holds what a deployment's replicas have in common: the
	// namespace, service account and network, the names telemetry labels
	// traffic with, the trust domain and the cluster ID; nil when all are
	// empty (issue 36: inline they were 144 bytes of every record;
	// converters share one value among the replicas). Read them through
	// the accessors of the same names, one pointer load more than a field
	// of the record.
	Labels *WorkloadLabels

	Addresses []netip.Addr

	// The small fields sit together, in one word (issue 36: the record's
	// size counts 100,000 times).
	Protocol     Protocol
	Status       HealthStatus
	NetworkMode  NetworkMode
	NativeTunnel bool
	// Capacity is the workload's load-balancing weight. Converters fill 1
	// when the source leaves it unset; 0 means the workload never receives
	// service traffic.
	Capacity uint32

	// Extra holds the fields most workloads leave empty, nil when all of
	// them are (issue 36: inline they were 64 bytes of every record). Read them
	// through the accessors of the same names, which take a nil Extra for
	// empty fields.
	Extra *WorkloadExtra

	// Services lists the "namespace/hostname" keys of the services this
	// workload is an endpoint of, each with the workload's port map for it
	// (service port -> target port). Converters share one set among the
	// workloads that have the same (a deployment's replicas).
	Services *ServiceSet

	// Place is the workload's node and locality, nil when it has neither;
	// converters share one value among the workloads of a node (issue 36:
	// inline, the node's name was 16 bytes of every record, which is 96
	// without it). Read them through the accessors Node and Locality.
	Place *Placement
}

// Placement is where a workload runs: its node and the node's locality.
// The struct is comparable, so that converters can share equal values.
type Placement struct {
	Node     string
	Locality Locality
}

// Node returns the name of the workload's node (Place.Node).
func (w *Workload) Node() string {
	if w.Place == nil {
		return ""
	}
	return w.Place.Node
}

// Locality returns the workload's locality, the zero Locality for none
// (Place.Locality).
func (w *Workload) Locality() Locality {
	if w.Place == nil {
		return Locality{}
	}
	return w.Place.Locality
}

// EditPlace gives w a Place value of its own, a copy of the one it had
// (empty for nil), and returns it to be filled: Place values are shared
// among workloads, so that one is never changed in place. It is for code
// that builds a workload, before it is published.
func (w *Workload) EditPlace() *Placement {
	p := &Placement{}
	if w.Place != nil {
		*p = *w.Place
	}
	w.Place = p
	return p
}

// WorkloadLabels are the names of a workload's deployment that telemetry
// labels its traffic with. The struct is comparable, so that converters can
// share equal values.
type WorkloadLabels struct {
	Namespace         string
	ServiceAccount    string // "" means "default" (see Identity)
	Network           string
	WorkloadName      string
	WorkloadType      string // lower-case kind, e.g. "deployment", "pod"
	CanonicalName     string
	CanonicalRevision string
	TrustDomain       string // "" means identity.DefaultTrustDomain
	ClusterID         string
}

// EditLabels gives w a Labels value of its own, a copy of the one it had
// (empty for nil), and returns it to be filled: Labels values are shared
// among workloads, so that one is never changed in place. It is for code
// that builds a workload, before it is published.
func (w *Workload) EditLabels() *WorkloadLabels {
	l := &WorkloadLabels{}
	if w.Labels != nil {
		*l = *w.Labels
	}
	w.Labels = l
	return l
}

// Namespace returns the workload's namespace (Labels.Namespace).
func (w *Workload) Namespace() string {
	if w.Labels == nil {
		return ""
	}
	return w.Labels.Namespace
}

// ServiceAccount returns the workload's service account, "" meaning
// "default" (Labels.ServiceAccount; see Identity).
func (w *Workload) ServiceAccount() string {
	if w.Labels == nil {
		return ""
	}
	return w.Labels.ServiceAccount
}

// Network returns the workload's network, "" for the default one
// (Labels.Network).
func (w *Workload) Network() string {
	if w.Labels == nil {
		return ""
	}
	return w.Labels.Network
}

// TrustDomain returns the workload's trust domain, "" meaning
// identity.DefaultTrustDomain (Labels.TrustDomain).
func (w *Workload) TrustDomain() string {
	if w.Labels == nil {
		return ""
	}
	return w.Labels.TrustDomain
}

// ClusterID returns the ID of the workload's cluster (Labels.ClusterID).
func (w *Workload) ClusterID() string {
	if w.Labels == nil {
		return ""
	}
	return w.Labels.ClusterID
}

// WorkloadName returns the name of the workload's deployment (or other
// owner), Labels.WorkloadName.
func (w *Workload) WorkloadName() string {
	if w.Labels == nil {
		return ""
	}
	return w.Labels.WorkloadName
}

// WorkloadType returns the lower-case kind of the workload's owner, e.g.
// "deployment", "pod" (Labels.WorkloadType).
func (w *Workload) WorkloadType() string {
	if w.Labels == nil {
		return ""
	}
	return w.Labels.WorkloadType
}

// CanonicalName returns the workload's canonical service name
// (Labels.CanonicalName).
func (w *Workload) CanonicalName() string {
	if w.Labels == nil {
		return ""
	}
	return w.Labels.CanonicalName
}

// CanonicalRevision returns the workload's canonical revision
// (Labels.CanonicalRevision).
func (w *Workload) CanonicalRevision() string {
	if w.Labels == nil {
		return ""
	}
	return w.Labels.CanonicalRevision
}

// WorkloadExtra is the part of a Workload most workloads leave empty.
type WorkloadExtra struct {
	// Hostname is set for workloads that have a DNS name instead of addresses.
	Hostname string

	Waypoint          *GatewayAddress
	NetworkGateway    *GatewayAddress
	ApplicationTunnel *ApplicationTunnel

	// AuthorizationPolicies lists "namespace/name" keys of the
	// WORKLOAD_SELECTOR policies that select this workload.
	AuthorizationPolicies []string

	// lostAddrs has bit i set when the workload's Addresses[i] is shared
	// with another workload that wins it (Writer's ranking): the address
	// stays the workload's own, dialled when it is picked as a service's
	// endpoint, but resolves to the winner, as ztunnel keeps every
	// workload's workload_ips and ranks only its by-address index. Only
	// the Writer's copies of such workloads set it (rare: in the record it
	// took the small fields past one word).
	lostAddrs uint8
}

// IsZero reports whether every field of x is empty (a workload then needs
// no Extra).
func (x *WorkloadExtra) IsZero() bool {
	return x == nil || x.Hostname == "" && x.Waypoint == nil && x.NetworkGateway == nil &&
		x.ApplicationTunnel == nil && len(x.AuthorizationPolicies) == 0 && x.lostAddrs == 0
}

// SetExtra sets w.Extra to a copy of x, or to nil when x is empty.
func (w *Workload) SetExtra(x WorkloadExtra) {
	if x.IsZero() {
		w.Extra = nil
		return
	}
	w.Extra = &x
}

// Hostname is set for workloads that have a DNS name instead of addresses
// (Extra.Hostname).
func (w *Workload) Hostname() string {
	if w.Extra == nil {
		return ""
	}
	return w.Extra.Hostname
}

// Waypoint returns the workload's waypoint, or nil (Extra.Waypoint).
func (w *Workload) Waypoint() *GatewayAddress {
	if w.Extra == nil {
		return nil
	}
	return w.Extra.Waypoint
}

// NetworkGateway returns the gateway that reaches the workload from other
// networks, or nil (Extra.NetworkGateway).
func (w *Workload) NetworkGateway() *GatewayAddress {
	if w.Extra == nil {
		return nil
	}
	return w.Extra.NetworkGateway
}

// ApplicationTunnel returns how the workload accepts tunneled traffic
// itself, or nil (Extra.ApplicationTunnel).
func (w *Workload) ApplicationTunnel() *ApplicationTunnel {
	if w.Extra == nil {
		return nil
	}
	return w.Extra.ApplicationTunnel
}

// AuthorizationPolicies lists the "namespace/name" keys of the
// WORKLOAD_SELECTOR policies that select the workload
// (Extra.AuthorizationPolicies).
func (w *Workload) AuthorizationPolicies() []string {
	if w.Extra == nil {
		return nil
	}
	return w.Extra.AuthorizationPolicies
}

// Identity returns the workload's SPIFFE identity, filling Istio's defaults
// for an empty trust domain (cluster.local) and service account (default).
func (w *Workload) Identity() identity.Identity {
	return identity.New(w.TrustDomain(), w.Namespace(), w.ServiceAccount())
}

// IPFamilies restricts which address families of a service's endpoints are
// used (istio.workload.IPFamilies).
type IPFamilies uint8

const (
	// IPFamiliesAutomatic applies no restriction.
	IPFamiliesAutomatic IPFamilies = iota
	// IPFamiliesIPv4 uses IPv4 endpoint addresses only.
	IPFamiliesIPv4
	// IPFamiliesIPv6 uses IPv6 endpoint addresses only.
	IPFamiliesIPv6
	// IPFamiliesDual uses both families.
	IPFamiliesDual
)

// String returns ztunnel's spelling: "IPv4", "IPv6", "Dual", or "" for automatic.
func (f IPFamilies) String() string {
	return enumName(f, "IPFamilies", "", "IPv4", "IPv6", "Dual")
}

// Visibility controls which client namespaces may resolve and route to a service.
type Visibility uint8

const (
	// VisibilityPublic services are visible to every client.
	VisibilityPublic Visibility = iota
	// VisibilityNamespace services are visible only within their namespace.
	VisibilityNamespace
)

// String returns "Public" or "Namespace".
func (v Visibility) String() string {
	return enumName(v, "Visibility", "Public", "Namespace")
}

// LBScope is one locality dimension a load balancer ranks endpoints by.
type LBScope uint8

const (
	LBScopeRegion  LBScope = iota // same Locality.Region
	LBScopeZone                   // same Locality.Zone
	LBScopeSubzone                // same Locality.Subzone
	LBScopeNode                   // same Workload.Node
	LBScopeCluster                // same Workload.ClusterID
	LBScopeNetwork                // same Workload.Network
)

// String returns ztunnel's spelling ("Region", "Zone", ...).
func (s LBScope) String() string {
	return enumName(s, "LBScope", "Region", "Zone", "Subzone", "Node", "Cluster", "Network")
}

// LBMode selects how routing preferences constrain endpoint choice.
type LBMode uint8

const (
	// LBModeStandard ignores routing preferences.
	LBModeStandard LBMode = iota
	// LBModeStrict uses only endpoints that match every routing preference.
	LBModeStrict
	// LBModeFailover prefers the endpoints that match the most leading
	// routing preferences.
	LBModeFailover
	// LBModePassthrough skips endpoint selection: traffic goes to the
	// original destination address.
	LBModePassthrough
)

// String returns ztunnel's spelling ("Standard", "Strict", ...).
func (m LBMode) String() string {
	return enumName(m, "LBMode", "Standard", "Strict", "Failover", "Passthrough")
}

// LBHealthPolicy says whether unhealthy workloads stay service endpoints.
type LBHealthPolicy uint8

const (
	// LBOnlyHealthy drops unhealthy workloads from the endpoints.
	LBOnlyHealthy LBHealthPolicy = iota
	// LBAllowAll keeps every workload, healthy or not.
	LBAllowAll
)

// String returns "OnlyHealthy" or "AllowAll".
func (p LBHealthPolicy) String() string {
	return enumName(p, "LBHealthPolicy", "OnlyHealthy", "AllowAll")
}

// LoadBalancer is a service's endpoint-selection configuration.
type LoadBalancer struct {
	RoutingPreferences []LBScope
	Mode               LBMode
	HealthPolicy       LBHealthPolicy
}

// WeightedWaypoint is one waypoint candidate with its selection weight.
type WeightedWaypoint struct {
	Destination GatewayAddress
	Weight      uint32
}

// Service is a named set of endpoints with virtual addresses. Its endpoints are
// not stored here: a Snapshot derives them from the workloads' Services.
// Values reachable from a Snapshot are shared and must not be modified.
type Service struct {
	Name      string
	Namespace string
	Hostname  string

	VIPs []NetworkAddress

	// Ports maps service port -> target port. A target port of 0 means "no
	// service-wide target": each endpoint's own port map must then name the
	// port, and endpoints that do not are skipped for that service port.
	Ports map[uint16]uint16

	Waypoint   *GatewayAddress
	IPFamilies IPFamilies
	Canonical  bool
	Visibility Visibility

	// Extra holds the fields most services leave empty, nil when all of
	// them are (issue 36: inline they were 80 bytes of every record, which
	// is 112 bytes without them). Read them through the accessors of the
	// same names, which take a nil Extra for empty fields.
	Extra *ServiceExtra
}

// ServiceExtra holds the rarely set fields of a Service.
type ServiceExtra struct {
	// CIDRVIPs are VIP ranges, matched by longest prefix when no exact VIP matches.
	CIDRVIPs          []NetworkPrefix
	SubjectAltNames   []string
	WeightedWaypoints []WeightedWaypoint
	LoadBalancer      *LoadBalancer // nil = standard, only healthy endpoints
}

// IsZero reports whether every field of x is empty.
func (x *ServiceExtra) IsZero() bool {
	return len(x.CIDRVIPs) == 0 && len(x.SubjectAltNames) == 0 && len(x.WeightedWaypoints) == 0 && x.LoadBalancer == nil
}

// SetExtra sets s.Extra to x, or to nil when x is empty.
func (s *Service) SetExtra(x ServiceExtra) {
	if x.IsZero() {
		s.Extra = nil
		return
	}
	s.Extra = &x
}

// EditExtra gives s an Extra value of its own, a copy of the one it had
// (empty for nil), and returns it to be filled. It is for code that builds
// a service, before it is published.
func (s *Service) EditExtra() *ServiceExtra {
	x := &ServiceExtra{}
	if s.Extra != nil {
		*x = *s.Extra
	}
	s.Extra = x
	return x
}

// CIDRVIPs returns the service's VIP ranges (Extra.CIDRVIPs).
func (s *Service) CIDRVIPs() []NetworkPrefix {
	if s.Extra == nil {
		return nil
	}
	return s.Extra.CIDRVIPs
}

// SubjectAltNames returns the identities the service's endpoints may
// present besides their own (Extra.SubjectAltNames).
func (s *Service) SubjectAltNames() []string {
	if s.Extra == nil {
		return nil
	}
	return s.Extra.SubjectAltNames
}

// WeightedWaypoints returns the service's weighted waypoints
// (Extra.WeightedWaypoints).
func (s *Service) WeightedWaypoints() []WeightedWaypoint {
	if s.Extra == nil {
		return nil
	}
	return s.Extra.WeightedWaypoints
}

// LoadBalancer returns the service's load balancing, nil for the standard
// one: only healthy endpoints (Extra.LoadBalancer).
func (s *Service) LoadBalancer() *LoadBalancer {
	if s.Extra == nil {
		return nil
	}
	return s.Extra.LoadBalancer
}

// Key returns the service's key, "namespace/hostname".
func (s *Service) Key() string { return s.Namespace + "/" + s.Hostname }

// VisibleTo reports whether a client in namespace ns may use the service.
func (s *Service) VisibleTo(ns string) bool {
	return s.Visibility != VisibilityNamespace || s.Namespace == ns
}

func (s *Service) includes(w *Workload) bool {
	return w.Status == Healthy || (s.LoadBalancer() != nil && s.LoadBalancer().HealthPolicy == LBAllowAll)
}
