package xdsconv

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/state"
)

// The xDS type URLs of the two resource types ztunnel subscribes to.
const (
	AddressType       = "type.googleapis.com/istio.workload.Address"
	AuthorizationType = "type.googleapis.com/istio.security.Authorization"
)

var (
	// ErrInvalidResource is wrapped by every conversion error: the resource
	// is rejected (NACKed) and the previous version, if any, stays.
	ErrInvalidResource = errors.New("xdsconv: invalid resource")
	// ErrLegacyIstioMTLS marks a workload whose tunnel protocol is
	// LEGACY_ISTIO_MTLS, which ztunnel cannot send and rejects. It wraps
	// ErrInvalidResource.
	ErrLegacyIstioMTLS = fmt.Errorf("%w: unsupported tunnel protocol: legacy istio mtls", ErrInvalidResource)
)

// Defaults ztunnel fills in for empty workload fields.
const (
	defaultServiceAccount = "default"
	defaultClusterID      = "Kubernetes"
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidResource}, args...)...)
}

// ConvertAddress converts an Address resource: exactly one of the results is
// non-nil on success.
func ConvertAddress(a *workloadapi.Address) (*state.Workload, *state.Service, error) {
	switch t := a.GetType().(type) {
	case *workloadapi.Address_Workload:
		w, err := ConvertWorkload(t.Workload)
		return w, nil, err
	case *workloadapi.Address_Service:
		s, err := ConvertService(t.Service)
		return nil, s, err
	}
	return nil, nil, invalid("unknown address type")
}

// ConvertWorkload converts a Workload as ztunnel does: empty trust domain,
// service account and cluster ID become cluster.local, default and
// Kubernetes; an absent capacity becomes 1; ports wider than 16 bits are
// truncated. Unknown enum values, addresses that are not 4 or 16 bytes,
// gateways without a destination, service keys that are not
// namespace/hostname and LEGACY_ISTIO_MTLS are rejected; so is an empty uid,
// which a snapshot cannot hold.
func ConvertWorkload(x *workloadapi.Workload) (*state.Workload, error) {
	if x.GetUid() == "" {
		return nil, invalid("workload %s/%s: uid is empty", x.GetNamespace(), x.GetName())
	}
	// What repeats across workloads is interned (intern.go); the uid and
	// the name are each workload's own.
	w := &state.Workload{
		UID:  x.GetUid(),
		Name: x.GetName(),
		Labels: internLabels(state.WorkloadLabels{
			Namespace:         x.GetNamespace(),
			ServiceAccount:    orDefault(x.GetServiceAccount(), defaultServiceAccount),
			Network:           x.GetNetwork(),
			WorkloadName:      x.GetWorkloadName(),
			WorkloadType:      workloadType(x.GetWorkloadType()),
			CanonicalName:     x.GetCanonicalName(),
			CanonicalRevision: x.GetCanonicalRevision(),
			TrustDomain:       orDefault(x.GetTrustDomain(), identity.DefaultTrustDomain),
			ClusterID:         orDefault(x.GetClusterId(), defaultClusterID),
		}),
		NativeTunnel: x.GetNativeTunnel(),
		Capacity:     1,
	}
	// The rare fields (most workloads have none of them) are filled in
	// extra, which becomes w.Extra if any is set.
	extra := state.WorkloadExtra{
		Hostname:              x.GetHostname(),
		AuthorizationPolicies: internAll(x.GetAuthorizationPolicies()),
	}
	nameInUID(w)
	if c := x.GetCapacity(); c != nil {
		w.Capacity = c.GetValue()
	}
	place := state.Placement{Node: x.GetNode()}
	if l := x.GetLocality(); l != nil {
		place.Locality = state.Locality{Region: l.GetRegion(), Zone: l.GetZone(), Subzone: l.GetSubzone()}
	}
	w.Place = internPlace(place)
	if x.GetTunnelProtocol() == workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS {
		return nil, ErrLegacyIstioMTLS
	}
	var err error
	if w.Protocol, err = wireEnum(x.GetTunnelProtocol(), tunnelProtocols, "tunnel protocol"); err != nil {
		return nil, err
	}
	if w.Status, err = wireEnum(x.GetStatus(), workloadStatuses, "workload status"); err != nil {
		return nil, err
	}
	if w.NetworkMode, err = wireEnum(x.GetNetworkMode(), networkModes, "network mode"); err != nil {
		return nil, err
	}
	if len(x.GetAddresses()) > 0 {
		w.Addresses = make([]netip.Addr, len(x.GetAddresses()))
		for i, b := range x.GetAddresses() {
			ip, err := bytesToIP(b)
			if err != nil {
				return nil, err
			}
			w.Addresses[i] = ip
		}
	}
	if extra.Waypoint, err = gatewayAddress(x.GetWaypoint(), "waypoint"); err != nil {
		return nil, err
	}
	if extra.NetworkGateway, err = gatewayAddress(x.GetNetworkGateway(), "network gateway"); err != nil {
		return nil, err
	}
	if t := x.GetApplicationTunnel(); t != nil {
		at := &state.ApplicationTunnel{Port: uint16(t.GetPort())}
		if at.Protocol, err = wireEnum(t.GetProtocol(), appTunnelProtocols, "application tunnel protocol"); err != nil {
			return nil, err
		}
		extra.ApplicationTunnel = at
	}
	internExtra(w, extra)
	if err := sharedServices(w, x.GetServices()); err != nil {
		return nil, err
	}
	return w, nil
}

// ConvertService converts a Service as ztunnel does: an address with a
// prefix length other than the host length becomes a CIDR VIP (the length
// truncated to 8 bits, then checked); an unknown visibility means PUBLIC.
// Unknown enum values (other than visibility), unspecified routing
// preferences, bad addresses and gateways without a destination are
// rejected, and so is an empty hostname, which a snapshot cannot hold.
func ConvertService(x *workloadapi.Service) (*state.Service, error) {
	if x.GetHostname() == "" {
		return nil, invalid("service %s/%s: hostname is empty", x.GetNamespace(), x.GetName())
	}
	s := &state.Service{
		Name:      x.GetName(),
		Namespace: intern(x.GetNamespace()),
		Hostname:  x.GetHostname(),
		Canonical: x.GetCanonical(),
	}
	// The rare fields (most services have none of them) are filled in
	// extra, which becomes s.Extra if any is set.
	extra := state.ServiceExtra{SubjectAltNames: x.GetSubjectAltNames()}
	nameInHostname(s)
	sharePorts(s, x.GetPorts())
	for _, a := range x.GetAddresses() {
		ip, err := bytesToIP(a.GetAddress())
		if err != nil {
			return nil, err
		}
		if a.Length != nil && int(a.GetLength()) != ip.BitLen() {
			bits := int(uint8(a.GetLength()))
			if bits > ip.BitLen() {
				return nil, invalid("prefix length %d is too long for %s", a.GetLength(), ip)
			}
			extra.CIDRVIPs = append(extra.CIDRVIPs, state.NetworkPrefix{Network: intern(a.GetNetwork()), Prefix: netip.PrefixFrom(ip, bits)})
			continue
		}
		s.VIPs = append(s.VIPs, state.NetworkAddress{Network: intern(a.GetNetwork()), Addr: ip})
	}
	var err error
	if s.Waypoint, err = gatewayAddress(x.GetWaypoint(), "waypoint"); err != nil {
		return nil, err
	}
	for i, ww := range x.GetWeightedWaypoints() {
		if ww.GetDestination() == nil {
			return nil, invalid("weighted waypoint %d: no destination", i)
		}
		g, err := gatewayAddress(ww.GetDestination(), "weighted waypoint")
		if err != nil {
			return nil, err
		}
		extra.WeightedWaypoints = append(extra.WeightedWaypoints, state.WeightedWaypoint{Destination: *g, Weight: ww.GetWeight()})
	}
	if lb := x.GetLoadBalancing(); lb != nil {
		out := &state.LoadBalancer{RoutingPreferences: make([]state.LBScope, 0, len(lb.GetRoutingPreference()))}
		for _, sc := range lb.GetRoutingPreference() {
			if sc < workloadapi.LoadBalancing_REGION || sc > workloadapi.LoadBalancing_NETWORK {
				return nil, invalid("invalid routing preference %d", sc)
			}
			// REGION..NETWORK are 1..6 on the wire and 0..5 in state.
			out.RoutingPreferences = append(out.RoutingPreferences, state.LBScope(sc-workloadapi.LoadBalancing_REGION))
		}
		if out.Mode, err = wireEnum(lb.GetMode(), lbModes, "load balancing mode"); err != nil {
			return nil, err
		}
		if out.HealthPolicy, err = wireEnum(lb.GetHealthPolicy(), lbHealthPolicies, "health policy"); err != nil {
			return nil, err
		}
		extra.LoadBalancer = out
	}
	s.SetExtra(extra)
	if s.IPFamilies, err = wireEnum(x.GetIpFamilies(), ipFamilies, "ip families"); err != nil {
		return nil, err
	}
	if x.GetVisibility() == workloadapi.Service_NAMESPACE {
		s.Visibility = state.VisibilityNamespace
	}
	return s, nil
}

// ConvertAuthorization converts an Authorization as ztunnel does: string
// matches with no variant and addresses that are not a valid CIDR are
// dropped from their match (a match left with nothing never matches); ports
// are truncated to 16 bits. Unknown scopes and actions are rejected, and so
// are an empty name and a namespace-scoped policy without a namespace, which
// a snapshot cannot hold.
func ConvertAuthorization(x *securityapi.Authorization) (*state.Policy, error) {
	p := &state.Policy{
		Name:      x.GetName(),
		Namespace: x.GetNamespace(),
		DryRun:    x.GetDryRun(),
		Rules:     make([][][]state.Match, 0, len(x.GetRules())),
	}
	if p.Name == "" {
		return nil, invalid("policy in namespace %q: name is empty", p.Namespace)
	}
	var err error
	if p.Scope, err = wireEnum(x.GetScope(), scopes, "scope"); err != nil {
		return nil, err
	}
	if p.Scope == state.ScopeNamespace && p.Namespace == "" {
		return nil, invalid("namespace-scoped policy %q has no namespace", p.Name)
	}
	if p.Action, err = wireEnum(x.GetAction(), actions, "action"); err != nil {
		return nil, err
	}
	for _, r := range x.GetRules() {
		rule := make([][]state.Match, 0, len(r.GetClauses()))
		for _, c := range r.GetClauses() {
			clause := make([]state.Match, 0, len(c.GetMatches()))
			for _, m := range c.GetMatches() {
				clause = append(clause, convertMatch(m))
			}
			rule = append(rule, clause)
		}
		p.Rules = append(p.Rules, rule)
	}
	return p, nil
}

func convertMatch(m *securityapi.Match) state.Match {
	return state.Match{
		Namespaces:          protoStringMatches(m.GetNamespaces()),
		NotNamespaces:       protoStringMatches(m.GetNotNamespaces()),
		Principals:          protoStringMatches(m.GetPrincipals()),
		NotPrincipals:       protoStringMatches(m.GetNotPrincipals()),
		ServiceAccounts:     serviceAccountMatches(m.GetServiceAccounts()),
		NotServiceAccounts:  serviceAccountMatches(m.GetNotServiceAccounts()),
		SourceIPs:           prefixes(m.GetSourceIps()),
		NotSourceIPs:        prefixes(m.GetNotSourceIps()),
		DestinationIPs:      prefixes(m.GetDestinationIps()),
		NotDestinationIPs:   prefixes(m.GetNotDestinationIps()),
		DestinationPorts:    ports16(m.GetDestinationPorts()),
		NotDestinationPorts: ports16(m.GetNotDestinationPorts()),
	}
}

func protoStringMatches(in []*securityapi.StringMatch) []state.StringMatch {
	var out []state.StringMatch
	for _, sm := range in {
		switch v := sm.GetMatchType().(type) {
		case *securityapi.StringMatch_Exact:
			out = append(out, state.StringMatch{Kind: state.MatchExact, Value: v.Exact})
		case *securityapi.StringMatch_Prefix:
			out = append(out, state.StringMatch{Kind: state.MatchPrefix, Value: v.Prefix})
		case *securityapi.StringMatch_Suffix:
			out = append(out, state.StringMatch{Kind: state.MatchSuffix, Value: v.Suffix})
		case *securityapi.StringMatch_Presence:
			out = append(out, state.StringMatch{Kind: state.MatchPresence})
		}
	}
	return out
}

func serviceAccountMatches(in []*securityapi.ServiceAccountMatch) []state.ServiceAccountMatch {
	if len(in) == 0 {
		return nil
	}
	out := make([]state.ServiceAccountMatch, len(in))
	for i, sa := range in {
		out[i] = state.ServiceAccountMatch{Namespace: sa.GetNamespace(), ServiceAccount: sa.GetServiceAccount()}
	}
	return out
}

func prefixes(in []*securityapi.Address) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range in {
		ip, err := bytesToIP(a.GetAddress())
		if err != nil {
			continue
		}
		bits := int(uint8(a.GetLength()))
		if bits > ip.BitLen() {
			continue
		}
		out = append(out, netip.PrefixFrom(ip, bits))
	}
	return out
}

func ports16(in []uint32) []uint16 {
	if len(in) == 0 {
		return nil
	}
	out := make([]uint16, len(in))
	for i, p := range in {
		out[i] = uint16(p)
	}
	return out
}

// protoPortMap turns ports into service port -> target port; a repeated service
// port keeps its last target, as ztunnel's map does.
// protoPorts converts a workload's ports for one service.
func protoPorts(ports []*workloadapi.Port) state.PortMap {
	pairs := make([]state.PortPair, len(ports))
	for i, p := range ports {
		pairs[i] = state.PortPair{Service: uint16(p.GetServicePort()), Target: uint16(p.GetTargetPort())}
	}
	return state.NewPortMap(pairs)
}

func protoPortMap(ports []*workloadapi.Port) map[uint16]uint16 {
	m := make(map[uint16]uint16, len(ports))
	for _, p := range ports {
		m[uint16(p.GetServicePort())] = uint16(p.GetTargetPort())
	}
	return m
}

func bytesToIP(b []byte) (netip.Addr, error) {
	switch len(b) {
	case 4:
		return netip.AddrFrom4([4]byte(b)), nil
	case 16:
		return netip.AddrFrom16([16]byte(b)), nil
	}
	return netip.Addr{}, invalid("address of %d bytes, want 4 or 16", len(b))
}

func gatewayAddress(g *workloadapi.GatewayAddress, what string) (*state.GatewayAddress, error) {
	if g == nil {
		return nil, nil
	}
	out := &state.GatewayAddress{HBONEMTLSPort: uint16(g.GetHboneMtlsPort())}
	switch d := g.GetDestination().(type) {
	case *workloadapi.GatewayAddress_Address:
		ip, err := bytesToIP(d.Address.GetAddress())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out.Address = &state.NetworkAddress{Network: intern(d.Address.GetNetwork()), Addr: ip}
	case *workloadapi.GatewayAddress_Hostname:
		out.Hostname = &state.NamespacedHostname{Namespace: intern(d.Hostname.GetNamespace()), Hostname: intern(d.Hostname.GetHostname())}
	default:
		return nil, invalid("%s: no destination", what)
	}
	return out, nil
}

// workloadType returns the lower-case kind name ztunnel reports; unknown
// values read as the proto default, deployment.
func workloadType(t workloadapi.WorkloadType) string {
	if name, ok := workloadTypes[t]; ok {
		return name
	}
	return workloadTypes[workloadapi.WorkloadType_DEPLOYMENT]
}

// The wire enums and the state values they convert to; a value not listed
// is rejected (LEGACY_ISTIO_MTLS has its own error, ErrLegacyIstioMTLS).
var (
	tunnelProtocols = map[workloadapi.TunnelProtocol]state.Protocol{
		workloadapi.TunnelProtocol_NONE:  state.ProtocolTCP,
		workloadapi.TunnelProtocol_HBONE: state.ProtocolHBONE,
	}
	workloadStatuses = map[workloadapi.WorkloadStatus]state.HealthStatus{
		workloadapi.WorkloadStatus_HEALTHY:   state.Healthy,
		workloadapi.WorkloadStatus_UNHEALTHY: state.Unhealthy,
	}
	networkModes = map[workloadapi.NetworkMode]state.NetworkMode{
		workloadapi.NetworkMode_STANDARD:     state.NetworkModeStandard,
		workloadapi.NetworkMode_HOST_NETWORK: state.NetworkModeHostNetwork,
	}
	appTunnelProtocols = map[workloadapi.ApplicationTunnel_Protocol]state.AppTunnelProtocol{
		workloadapi.ApplicationTunnel_NONE:  state.AppTunnelNone,
		workloadapi.ApplicationTunnel_PROXY: state.AppTunnelProxy,
	}
	lbModes = map[workloadapi.LoadBalancing_Mode]state.LBMode{
		workloadapi.LoadBalancing_UNSPECIFIED_MODE: state.LBModeStandard,
		workloadapi.LoadBalancing_STRICT:           state.LBModeStrict,
		workloadapi.LoadBalancing_FAILOVER:         state.LBModeFailover,
		workloadapi.LoadBalancing_PASSTHROUGH:      state.LBModePassthrough,
	}
	lbHealthPolicies = map[workloadapi.LoadBalancing_HealthPolicy]state.LBHealthPolicy{
		workloadapi.LoadBalancing_ONLY_HEALTHY: state.LBOnlyHealthy,
		workloadapi.LoadBalancing_ALLOW_ALL:    state.LBAllowAll,
	}
	ipFamilies = map[workloadapi.IPFamilies]state.IPFamilies{
		workloadapi.IPFamilies_AUTOMATIC: state.IPFamiliesAutomatic,
		workloadapi.IPFamilies_IPV4_ONLY: state.IPFamiliesIPv4,
		workloadapi.IPFamilies_IPV6_ONLY: state.IPFamiliesIPv6,
		workloadapi.IPFamilies_DUAL:      state.IPFamiliesDual,
	}
	scopes = map[securityapi.Scope]state.Scope{
		securityapi.Scope_GLOBAL:            state.ScopeGlobal,
		securityapi.Scope_NAMESPACE:         state.ScopeNamespace,
		securityapi.Scope_WORKLOAD_SELECTOR: state.ScopeWorkloadSelector,
	}
	actions = map[securityapi.Action]state.Action{
		securityapi.Action_ALLOW: state.ActionAllow,
		securityapi.Action_DENY:  state.ActionDeny,
	}
)

// wireEnum converts a wire enum value through values, rejecting one it does not
// list as an unknown what.
func wireEnum[W ~int32, S any](v W, values map[W]S, what string) (S, error) {
	out, ok := values[v]
	if !ok {
		return out, invalid("unknown %s %d", what, int32(v))
	}
	return out, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
