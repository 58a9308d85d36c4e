package state

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ErrInvalid is wrapped by every error NewSnapshot returns.
var ErrInvalid = errors.New("state: invalid snapshot")

// maxErrors bounds how many problems NewSnapshot reports at once.
const maxErrors = 20

// Endpoint is one workload serving a service, with its port map for that
// service (service port -> target port).
type Endpoint struct {
	Workload *Workload
	Ports    map[uint16]uint16
}

// Snapshot is an immutable view of workloads, services and policies with the
// indexes the data path needs. It is immutable once created: every method is
// safe for concurrent use, and slices and values it returns are shared and
// must not be modified.
type Snapshot struct {
	workloads []*Workload // sorted by UID
	services  []*Service  // sorted by key

	byUID  map[string]*Workload
	byAddr map[NetworkAddress]*Workload
	byInfo map[nsName][]*Workload // sorted by UID
	// byHost indexes hostname-only workloads by namespace and hostname
	// (the lowest UID wins a tie).
	byHost map[NamespacedHostname]*Workload

	svcByKey  map[NamespacedHostname]*Service
	svcByVIP  map[NetworkAddress][]*Service // sorted by key
	svcByHost map[string][]*Service         // sorted by key
	cidrVIPs  []cidrVIP
	endpoints map[NamespacedHostname][]Endpoint

	// pol is the compiled policy table, shared with the snapshots derived
	// by WithWorkloads.
	pol *policyTable

	warnings []string
}

type nsName struct{ ns, name string }

type cidrVIP struct {
	prefix NetworkPrefix
	svc    *Service
}

// Empty returns a snapshot with no workloads, services or policies.
func Empty() *Snapshot {
	s, _ := NewSnapshot(nil, nil, nil)
	return s
}

// NewSnapshot validates the given values and indexes them, compiling the
// policies into a table with a new PolicyGeneration (or generation 0 when
// there are none). It takes ownership: callers must not modify the values
// afterwards. Service endpoints are derived
// from the workloads' Services maps; unhealthy workloads are left out unless
// the service's health policy is LBAllowAll.
//
// It rejects duplicate workload UIDs, service keys and policy keys, two
// workloads with the same address on one network (ztunnel would keep both and
// pick one by rank; a snapshot has one owner per address), and out-of-range
// or malformed values. All problems found (up to a limit) are joined in the
// error, each wrapping ErrInvalid.
func NewSnapshot(workloads []*Workload, services []*Service, policies []*Policy) (*Snapshot, error) {
	b := newBuilder(workloads, services)
	b.addServices(services)
	b.addWorkloads(workloads)
	pol := reusableTable(policies)
	if pol == nil {
		valid := b.checkPolicies(policies)
		if len(b.errs) == 0 {
			pol = compilePolicies(valid)
		}
	}
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	b.s.pol = pol
	b.finish()
	return b.s, nil
}

// WithWorkloads returns a snapshot with the given workloads and services and
// s's policies, validated and indexed as NewSnapshot does. The new snapshot
// shares s's compiled policy table, so it has the same PolicyGeneration and
// costs nothing to compile. A converter uses it for an update that carries no
// policy (an Address push in xDS), so that watchers of policy changes, such
// as the connection manager, are not woken for nothing.
func (s *Snapshot) WithWorkloads(workloads []*Workload, services []*Service) (*Snapshot, error) {
	b := newBuilder(workloads, services)
	b.addServices(services)
	b.addWorkloads(workloads)
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	b.s.pol = s.pol
	b.finish()
	return b.s, nil
}

// PolicyGeneration identifies the snapshot's policy set, so that a watcher
// can tell a policy change from a workload-only update in O(1).
//
// The contract: snapshots with the same generation have the same policies
// and make the same Authorize decision for the same Conn. WithWorkloads
// carries the generation over, and every snapshot without policies has
// generation 0. NewSnapshot given exactly the same *Policy values as the
// previous NewSnapshot with policies (in any order) reuses its compiled
// table and generation; otherwise it compiles a table with a new
// generation, larger than any before it, even for policies equal to an
// earlier snapshot's. So a different generation means the policies may have
// changed, not that they did.
//
// A converter therefore builds with WithWorkloads when an update carries no
// policy (an Address push), or keeps its Policy values from one update to
// the next, and open connections are re-checked only on Authorization
// pushes, as in ztunnel.
func (s *Snapshot) PolicyGeneration() uint64 { return s.pol.gen }

func newBuilder(workloads []*Workload, services []*Service) *builder {
	return &builder{s: &Snapshot{
		byUID:     make(map[string]*Workload, len(workloads)),
		byAddr:    make(map[NetworkAddress]*Workload, len(workloads)),
		byInfo:    make(map[nsName][]*Workload, len(workloads)),
		byHost:    make(map[NamespacedHostname]*Workload),
		svcByKey:  make(map[NamespacedHostname]*Service, len(services)),
		svcByVIP:  make(map[NetworkAddress][]*Service, len(services)),
		svcByHost: make(map[string][]*Service, len(services)),
		endpoints: make(map[NamespacedHostname][]Endpoint, len(services)),
		pol:       emptyTable,
	}}
}

type builder struct {
	s    *Snapshot
	errs []error
}

func (b *builder) fail(format string, args ...any) {
	if len(b.errs) == maxErrors {
		b.errs = append(b.errs, fmt.Errorf("%w: too many errors", ErrInvalid))
	}
	if len(b.errs) > maxErrors {
		return
	}
	b.errs = append(b.errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...))
}

func (b *builder) addServices(services []*Service) {
	s := b.s
	s.services = make([]*Service, 0, len(services))
	for i, svc := range services {
		if svc == nil {
			b.fail("service %d is nil", i)
			continue
		}
		key := NamespacedHostname{svc.Namespace, svc.Hostname}
		what := subject{"service", key.String()}
		if svc.Hostname == "" {
			b.fail("service %d (%s): hostname is empty", i, svc.Name)
			continue
		}
		if _, dup := s.svcByKey[key]; dup {
			b.fail("%s: duplicate service key", what)
			continue
		}
		s.svcByKey[key] = svc
		s.services = append(s.services, svc)
		for _, vip := range svc.VIPs {
			if !validAddr(vip.Addr) {
				b.fail("%s: invalid VIP %q", what, vip.String())
			}
		}
		for _, p := range svc.CIDRVIPs {
			if !p.Prefix.IsValid() || p.Prefix.Addr().Zone() != "" {
				b.fail("%s: invalid CIDR VIP %q", what, p.String())
			}
		}
		b.checkGateway(what, "waypoint", svc.Waypoint)
		for j := range svc.WeightedWaypoints {
			b.checkGateway(what, "weighted waypoint "+strconv.Itoa(j), &svc.WeightedWaypoints[j].Destination)
		}
		if lb := svc.LoadBalancer; lb != nil {
			if lb.Mode > LBModePassthrough {
				b.fail("%s: invalid load balancer mode %d", what, lb.Mode)
			}
			if lb.HealthPolicy > LBAllowAll {
				b.fail("%s: invalid health policy %d", what, lb.HealthPolicy)
			}
			for _, sc := range lb.RoutingPreferences {
				if sc > LBScopeNetwork {
					b.fail("%s: invalid routing preference %d", what, sc)
				}
			}
		}
		if svc.IPFamilies > IPFamiliesDual {
			b.fail("%s: invalid ip families %d", what, svc.IPFamilies)
		}
		if svc.Visibility > VisibilityNamespace {
			b.fail("%s: invalid visibility %d", what, svc.Visibility)
		}
	}
	sortByKey(s.services, (*Service).Key)
	for _, svc := range s.services {
		for _, vip := range svc.VIPs {
			k := NetworkAddress{vip.Network, vip.Addr.Unmap()}
			if !slices.Contains(s.svcByVIP[k], svc) {
				s.svcByVIP[k] = append(s.svcByVIP[k], svc)
			}
		}
		for _, p := range svc.CIDRVIPs {
			s.cidrVIPs = append(s.cidrVIPs, cidrVIP{p, svc})
		}
		s.svcByHost[svc.Hostname] = append(s.svcByHost[svc.Hostname], svc)
	}
}

func (b *builder) addWorkloads(workloads []*Workload) {
	s := b.s
	s.workloads = make([]*Workload, 0, len(workloads))
	for i, w := range workloads {
		if w == nil {
			b.fail("workload %d is nil", i)
			continue
		}
		if w.UID == "" {
			b.fail("workload %d (%s/%s): uid is empty", i, w.Namespace, w.Name)
			continue
		}
		if _, dup := s.byUID[w.UID]; dup {
			b.fail("workload %q: duplicate uid", w.UID)
			continue
		}
		s.byUID[w.UID] = w
		s.workloads = append(s.workloads, w)
	}
	slices.SortFunc(s.workloads, func(a, b *Workload) int { return cmp.Compare(a.UID, b.UID) })

	for _, w := range s.workloads {
		what := subject{"workload", w.UID}
		if w.Protocol > ProtocolHBONE {
			b.fail("%s: invalid protocol %d", what, w.Protocol)
		}
		if w.Status > Unhealthy {
			b.fail("%s: invalid status %d", what, w.Status)
		}
		if w.NetworkMode > NetworkModeHostNetwork {
			b.fail("%s: invalid network mode %d", what, w.NetworkMode)
		}
		if t := w.ApplicationTunnel; t != nil && t.Protocol > AppTunnelProxy {
			b.fail("%s: invalid application tunnel protocol %d", what, t.Protocol)
		}
		b.checkGateway(what, "waypoint", w.Waypoint)
		b.checkGateway(what, "network gateway", w.NetworkGateway)
		for _, ip := range w.Addresses {
			if !validAddr(ip) {
				b.fail("%s: invalid address %q", what, ip.String())
				continue
			}
			if w.NetworkMode == NetworkModeHostNetwork {
				continue // the address is the node's, not the workload's
			}
			k := NetworkAddress{w.Network, ip.Unmap()}
			if other, dup := s.byAddr[k]; dup && other != w {
				b.fail("address %s is used by two workloads: %q and %q", k.String(), other.UID, w.UID)
				continue
			}
			s.byAddr[k] = w
		}
		ni := nsName{w.Namespace, w.Name}
		s.byInfo[ni] = append(s.byInfo[ni], w)
		if w.Hostname != "" {
			if nh := (NamespacedHostname{w.Namespace, w.Hostname}); s.byHost[nh] == nil {
				s.byHost[nh] = w
			}
		}

		for _, k := range sortedKeys(w.Services) {
			ns, host, ok := strings.Cut(k, "/")
			if !ok {
				b.fail("%s: service key %q is not namespace/hostname", what, k)
				continue
			}
			nh := NamespacedHostname{ns, host}
			svc := s.svcByKey[nh]
			if svc == nil || !svc.includes(w) {
				// Endpoints of unknown services are unreachable: ztunnel
				// stages them until the service arrives, which for us is
				// the next snapshot.
				continue
			}
			s.endpoints[nh] = append(s.endpoints[nh], Endpoint{Workload: w, Ports: w.Services[k]})
		}
	}
}

// checkPolicies validates policies and returns the valid ones in a new
// slice. Errors are recorded on b.
func (b *builder) checkPolicies(policies []*Policy) []*Policy {
	valid := make([]*Policy, 0, len(policies))
	seen := make(map[string]struct{}, len(policies))
	for i, p := range policies {
		if p == nil {
			b.fail("policy %d is nil", i)
			continue
		}
		if p.Name == "" {
			b.fail("policy %d: name is empty", i)
			continue
		}
		key := p.Key()
		what := subject{"policy", key}
		if _, dup := seen[key]; dup {
			b.fail("%s: duplicate policy key", what)
			continue
		}
		seen[key] = struct{}{}
		if p.Scope > ScopeWorkloadSelector {
			b.fail("%s: invalid scope %d", what, p.Scope)
		}
		if p.Action > ActionDeny {
			b.fail("%s: invalid action %d", what, p.Action)
		}
		if p.Scope == ScopeNamespace && p.Namespace == "" {
			// Indexed under "" it would silently become global.
			b.fail("%s: namespace-scoped policy has no namespace", what)
		}
		b.checkRules(what, p.Rules)
		valid = append(valid, p)
	}
	return valid
}

func (b *builder) checkRules(what subject, rules [][][]Match) {
	for ri, rule := range rules {
		for ci, clause := range rule {
			for mi := range clause {
				m := &clause[mi]
				for _, l := range [][]StringMatch{m.Namespaces, m.NotNamespaces, m.Principals, m.NotPrincipals} {
					for _, sm := range l {
						if sm.Kind > MatchPresence {
							b.fail("%s: rules[%d][%d][%d]: invalid string match kind %d", what, ri, ci, mi, sm.Kind)
						}
					}
				}
				for _, l := range [][]netip.Prefix{m.SourceIPs, m.NotSourceIPs, m.DestinationIPs, m.NotDestinationIPs} {
					for _, p := range l {
						if !p.IsValid() || p.Addr().Zone() != "" {
							b.fail("%s: rules[%d][%d][%d]: invalid CIDR %q", what, ri, ci, mi, p.String())
						}
					}
				}
			}
		}
	}
}

func (b *builder) checkGateway(what subject, part string, g *GatewayAddress) {
	if g == nil {
		return
	}
	switch {
	case (g.Address == nil) == (g.Hostname == nil):
		b.fail("%s: %s: exactly one of address and hostname must be set", what, part)
	case g.Address != nil && !validAddr(g.Address.Addr):
		b.fail("%s: %s: invalid address %q", what, part, g.Address.String())
	}
}

// subject names what an error is about; it is formatted only on error.
type subject struct{ kind, key string }

func (s subject) String() string {
	if s.kind == "workload" {
		return "workload " + strconv.Quote(s.key) // UIDs may hold anything
	}
	return s.kind + " " + s.key
}

// finish records warnings that need every index in place.
func (b *builder) finish() {
	s := b.s
	for _, w := range s.workloads {
		for _, k := range w.AuthorizationPolicies {
			if s.pol.byKey[k] == nil {
				s.warnings = append(s.warnings, fmt.Sprintf("workload %q lists unknown authorization policy %q; skipping it", w.UID, k))
			}
		}
	}
}

// sortedKeys returns m's keys in order, so that endpoint lists are deterministic.
func sortedKeys[V any](m map[string]V) []string {
	if len(m) == 1 {
		for k := range m {
			return []string{k}
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// sortByKey sorts list by key(element), computing each key once.
func sortByKey[T any](list []T, key func(T) string) {
	keyed := make([]struct {
		k string
		v T
	}, len(list))
	for i, v := range list {
		keyed[i].k, keyed[i].v = key(v), v
	}
	slices.SortFunc(keyed, func(a, b struct {
		k string
		v T
	}) int {
		return cmp.Compare(a.k, b.k)
	})
	for i := range keyed {
		list[i] = keyed[i].v
	}
}

func validAddr(ip netip.Addr) bool { return ip.IsValid() && ip.Zone() == "" }

// Workloads returns every workload, sorted by UID.
func (s *Snapshot) Workloads() []*Workload { return s.workloads }

// Services returns every service, sorted by key.
func (s *Snapshot) Services() []*Service { return s.services }

// Policies returns every policy, sorted by key.
func (s *Snapshot) Policies() []*Policy { return s.pol.policies }

// Warnings returns problems that did not prevent building the snapshot, such
// as a workload listing a policy key the snapshot lacks. Callers log them once
// when they publish the snapshot.
func (s *Snapshot) Warnings() []string { return s.warnings }

// WorkloadByUID returns the workload with the given UID, or nil.
func (s *Snapshot) WorkloadByUID(uid string) *Workload { return s.byUID[uid] }

// WorkloadByAddr returns the workload that owns ip on network, or nil.
// Host-network workloads are never returned: their addresses are the node's.
func (s *Snapshot) WorkloadByAddr(network string, ip netip.Addr) *Workload {
	return s.byAddr[NetworkAddress{network, ip.Unmap()}]
}

// ServiceByKey returns the service with key "namespace/hostname", or nil.
func (s *Snapshot) ServiceByKey(key string) *Service {
	ns, host, ok := strings.Cut(key, "/")
	if !ok {
		return nil
	}
	return s.svcByKey[NamespacedHostname{ns, host}]
}

// ServicesByHostname returns the services with the given hostname (one per
// namespace at most), sorted by key.
func (s *Snapshot) ServicesByHostname(host string) []*Service { return s.svcByHost[host] }

// ServiceByVIP returns the service with the exact VIP ip on network, or nil.
// When several services share the VIP, a canonical one wins, then the first
// by key. Clients that know their namespace use ResolveVIP instead.
func (s *Snapshot) ServiceByVIP(network string, ip netip.Addr) *Service {
	return bestService(s.svcByVIP[NetworkAddress{network, ip.Unmap()}], "", "", false)
}

// ResolveVIP returns the service a client in namespace clientNS reaches by
// dialing ip on network, as ztunnel chooses it: among exact VIP matches
// visible to the client, one in the client's namespace wins, then a canonical
// one, then the first by key; without an exact match, CIDR VIPs are ranked by
// (in the client's namespace, prefix length, canonical).
func (s *Snapshot) ResolveVIP(network string, ip netip.Addr, clientNS string) *Service {
	return s.resolveVIP(network, ip, clientNS, "", true)
}

// ResolveVIPPreferring is ResolveVIP with a tiebreak namespace
// (PREFERED_SERVICE_NAMESPACE): among exact VIP matches, after the client's
// namespace and a canonical service, a service in preferredNS wins over the
// first by key. "" prefers nothing.
func (s *Snapshot) ResolveVIPPreferring(network string, ip netip.Addr, clientNS, preferredNS string) *Service {
	return s.resolveVIP(network, ip, clientNS, preferredNS, true)
}

// resolveVIP implements the VIP lookups; without useNS there is no client:
// visibility is not checked and no namespace is preferred.
func (s *Snapshot) resolveVIP(network string, ip netip.Addr, clientNS, preferredNS string, useNS bool) *Service {
	ip = ip.Unmap()
	if svc := bestService(s.svcByVIP[NetworkAddress{network, ip}], clientNS, preferredNS, useNS); svc != nil {
		return svc
	}
	var (
		best     *Service
		bestRank [3]int
	)
	for _, c := range s.cidrVIPs {
		if c.prefix.Network != network || !c.prefix.Prefix.Contains(ip) || (useNS && !c.svc.VisibleTo(clientNS)) {
			continue
		}
		rank := [3]int{b2i(useNS && c.svc.Namespace == clientNS), c.prefix.Prefix.Bits(), b2i(c.svc.Canonical)}
		if best == nil || slices.Compare(rank[:], bestRank[:]) > 0 {
			best, bestRank = c.svc, rank
		}
	}
	return best
}

// bestService ranks services sharing a VIP or hostname as ztunnel does: one
// in the client's namespace, then a canonical one, then one in preferredNS,
// then the first (by key). Without useNS, visibility is not checked.
func bestService(list []*Service, clientNS, preferredNS string, useNS bool) *Service {
	var first, canonical, preferred *Service
	for _, svc := range list {
		if useNS {
			if !svc.VisibleTo(clientNS) {
				continue
			}
			if svc.Namespace == clientNS {
				return svc
			}
		}
		if first == nil {
			first = svc
		}
		if canonical == nil && svc.Canonical {
			canonical = svc
		}
		if preferred == nil && preferredNS != "" && svc.Namespace == preferredNS {
			preferred = svc
		}
	}
	switch {
	case canonical != nil:
		return canonical
	case preferred != nil:
		return preferred
	}
	return first
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Endpoints returns the endpoints of svc (a service of this snapshot), sorted
// by workload UID. Unhealthy workloads are included only when the service's
// health policy is LBAllowAll.
func (s *Snapshot) Endpoints(svc *Service) []Endpoint {
	return s.endpoints[NamespacedHostname{svc.Namespace, svc.Hostname}]
}

// WorkloadInfo identifies the workload a dedicated proxy serves
// (PROXY_WORKLOAD_INFO is "namespace/name/service-account").
type WorkloadInfo struct {
	Namespace, Name, ServiceAccount string
	// Node, when set, restricts the search to workloads on that node.
	Node string
}

// FindWorkload returns the workload matching info (service account compared
// after defaulting, as ztunnel does), or nil. If several match, the one with
// the lowest UID wins.
func (s *Snapshot) FindWorkload(info WorkloadInfo) *Workload {
	sa := info.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	for _, w := range s.byInfo[nsName{info.Namespace, info.Name}] {
		if (info.Node == "" || w.Node == info.Node) && w.Identity().ServiceAccount == sa {
			return w
		}
	}
	return nil
}
