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

// builder builds one snapshot: from scratch (fresh, NewSnapshot), or from a
// copy of a previous snapshot's indexes (Apply), which it edits in place,
// cloning what it writes to. Both paths share the checks and the index
// updates, so that they validate and index alike.
type builder struct {
	s     *Snapshot
	errs  []error
	fresh bool

	byUID     *shardEdit[string, *Workload]
	byAddr    *shardEdit[NetworkAddress, *Workload]
	byInfo    *shardEdit[infoKey, []*Workload]
	byHost    *shardEdit[NamespacedHostname, []*Workload]
	svcByKey  *shardEdit[NamespacedHostname, *Service]
	svcByVIP  *shardEdit[NetworkAddress, []*Service]
	svcByHost *shardEdit[string, []*Service]
	members   *shardEdit[NamespacedHostname, []Endpoint]
	endpoints *shardEdit[NamespacedHostname, []Endpoint]

	// touched holds the service keys whose endpoints an edit must derive
	// again (a fresh build derives those of every service).
	touched map[NamespacedHostname]struct{}
	// cidrGone and cidrNew are the services whose CIDR VIPs leave and join
	// the snapshot's list.
	cidrGone map[*Service]struct{}
	cidrNew  []*Service
}

// newBuilder returns a builder of s: a fresh one sized for nw workloads and
// ns services, or one editing the indexes s holds, copied from a previous
// snapshot. The hash given to each edit is the one its lookups use.
func newBuilder(s *Snapshot, fresh bool, nw, ns int) *builder {
	return &builder{
		s:         s,
		fresh:     fresh,
		byUID:     newShardEdit(&s.byUID, hashString, fresh, nw),
		byAddr:    newShardEdit(&s.byAddr, hashAddr, fresh, nw),
		byInfo:    newShardEdit(&s.byInfo, hashInfo, fresh, nw),
		byHost:    newShardEdit(&s.byHost, hashNH, fresh, 0),
		svcByKey:  newShardEdit(&s.svcByKey, hashNH, fresh, ns),
		svcByVIP:  newShardEdit(&s.svcByVIP, hashAddr, fresh, ns),
		svcByHost: newShardEdit(&s.svcByHost, hashString, fresh, ns),
		members:   newShardEdit(&s.members, hashNH, fresh, ns),
		endpoints: newShardEdit(&s.endpoints, hashNH, fresh, ns),
		touched:   map[NamespacedHostname]struct{}{},
		cidrGone:  map[*Service]struct{}{},
	}
}

// buildFresh validates and indexes workloads and services into a new
// snapshot (without policies); errors are recorded on the builder.
func buildFresh(workloads []*Workload, services []*Service) *builder {
	b := newBuilder(&Snapshot{}, true, len(workloads), len(services))
	svcs := make([]*Service, 0, len(services))
	for i, svc := range services {
		if !b.checkServiceKey(i, svc) {
			continue
		}
		key := NamespacedHostname{svc.Namespace, svc.Hostname}
		if b.svcByKey.get(key) != nil {
			b.fail("%s: duplicate service key", subject{"service", key.String()})
			continue
		}
		b.checkService(svc)
		b.indexService(svc)
		svcs = append(svcs, svc)
	}
	sortByKey(svcs, (*Service).Key)
	b.s.services.set(svcs)

	wls := make([]*Workload, 0, len(workloads))
	for i, w := range workloads {
		if !b.checkWorkloadKey(i, w) {
			continue
		}
		if b.byUID.get(w.UID) != nil {
			b.fail("workload %q: duplicate uid", w.UID)
			continue
		}
		b.byUID.set(w.UID, w)
		wls = append(wls, w)
	}
	slices.SortFunc(wls, cmpWorkloads)
	for _, w := range wls {
		b.checkWorkload(w)
		b.indexWorkload(w)
	}
	b.s.workloads.set(wls)
	return b
}

// done returns the snapshot with pol as its policy table, or the errors.
func (b *builder) done(pol *policyTable) (*Snapshot, error) {
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	b.finish()
	b.s.pol = pol
	return b.s, nil
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

// checkServiceKey reports whether the i-th service can be indexed at all.
func (b *builder) checkServiceKey(i int, svc *Service) bool {
	if svc == nil {
		b.fail("service %d is nil", i)
		return false
	}
	if svc.Hostname == "" {
		b.fail("service %d (%s): hostname is empty", i, svc.Name)
		return false
	}
	return true
}

// checkService validates a service's fields.
func (b *builder) checkService(svc *Service) {
	what := subject{"service", svc.Key()}
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

// indexService adds svc (whose key is not indexed) to the service indexes.
func (b *builder) indexService(svc *Service) {
	key := NamespacedHostname{svc.Namespace, svc.Hostname}
	b.svcByKey.set(key, svc)
	for _, vip := range svc.VIPs {
		// A VIP listed twice is indexed once: insertSorted keeps the first.
		insertSorted(b.svcByVIP, NetworkAddress{vip.Network, vip.Addr.Unmap()}, svc, cmpServices)
	}
	if len(svc.CIDRVIPs) > 0 {
		b.cidrNew = append(b.cidrNew, svc)
	}
	insertSorted(b.svcByHost, svc.Hostname, svc, cmpServices)
	b.touch(key)
}

// unindexService removes svc, indexed, from the service indexes.
func (b *builder) unindexService(svc *Service) {
	key := NamespacedHostname{svc.Namespace, svc.Hostname}
	b.svcByKey.del(key)
	for _, vip := range svc.VIPs {
		removeSorted(b.svcByVIP, NetworkAddress{vip.Network, vip.Addr.Unmap()}, svc, cmpServices)
	}
	if len(svc.CIDRVIPs) > 0 {
		b.cidrGone[svc] = struct{}{}
	}
	removeSorted(b.svcByHost, svc.Hostname, svc, cmpServices)
	b.touch(key)
}

// checkWorkloadKey reports whether the i-th workload can be indexed at all.
func (b *builder) checkWorkloadKey(i int, w *Workload) bool {
	if w == nil {
		b.fail("workload %d is nil", i)
		return false
	}
	if w.UID == "" {
		b.fail("workload %d (%s/%s): uid is empty", i, w.Namespace, w.Name)
		return false
	}
	return true
}

// checkWorkload validates a workload's fields (its addresses and service
// keys are checked as they are indexed).
func (b *builder) checkWorkload(w *Workload) {
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
}

// indexWorkload adds w, already in byUID, to the other workload indexes.
func (b *builder) indexWorkload(w *Workload) {
	what := subject{"workload", w.UID}
	for i, ip := range w.Addresses {
		if !validAddr(ip) {
			b.fail("%s: invalid address %q", what, ip.String())
			continue
		}
		if w.NetworkMode == NetworkModeHostNetwork {
			continue // the address is the node's, not the workload's
		}
		if w.losesAddr(i) {
			continue // another workload wins it
		}
		k := NetworkAddress{w.Network, ip.Unmap()}
		if other := b.byAddr.get(k); other != nil && other != w {
			first, second := other, w
			if first.UID > second.UID {
				first, second = second, first
			}
			b.fail("address %s is used by two workloads: %q and %q", k.String(), first.UID, second.UID)
			continue
		}
		b.byAddr.set(k, w)
	}
	insertSorted(b.byInfo, infoKeyOf(w.Namespace, w.Name), w, cmpWorkloads)
	if w.Hostname != "" {
		insertSorted(b.byHost, NamespacedHostname{w.Namespace, w.Hostname}, w, cmpWorkloads)
	}
	for _, k := range sortedKeys(w.Services) {
		ns, host, ok := strings.Cut(k, "/")
		if !ok {
			b.fail("%s: service key %q is not namespace/hostname", what, k)
			continue
		}
		// Endpoints of unknown services are unreachable: ztunnel stages
		// them until the service arrives, which for us is the snapshot
		// that brings it (members keeps them until then).
		nh := NamespacedHostname{ns, host}
		insertSorted(b.members, nh, Endpoint{Workload: w, Ports: w.Services[k]}, cmpEndpoints)
		b.touch(nh)
	}
}

// unindexWorkload removes w, indexed, from every workload index.
func (b *builder) unindexWorkload(w *Workload) {
	b.byUID.del(w.UID)
	if w.NetworkMode != NetworkModeHostNetwork {
		for _, ip := range w.Addresses {
			if k := (NetworkAddress{w.Network, ip.Unmap()}); b.byAddr.get(k) == w {
				b.byAddr.del(k)
			}
		}
	}
	removeSorted(b.byInfo, infoKeyOf(w.Namespace, w.Name), w, cmpWorkloads)
	if w.Hostname != "" {
		removeSorted(b.byHost, NamespacedHostname{w.Namespace, w.Hostname}, w, cmpWorkloads)
	}
	for k := range w.Services {
		if ns, host, ok := strings.Cut(k, "/"); ok {
			nh := NamespacedHostname{ns, host}
			removeSorted(b.members, nh, Endpoint{Workload: w}, cmpEndpoints)
			b.touch(nh)
		}
	}
}

// touch records that the endpoints of the service under key must be derived
// again (a fresh build derives them all anyway).
func (b *builder) touch(key NamespacedHostname) {
	if !b.fresh {
		b.touched[key] = struct{}{}
	}
}

// finish derives the endpoints and CIDR VIPs of what changed (of
// everything, when fresh) and re-splits the indexes that outgrew their
// shards.
func (b *builder) finish() {
	s := b.s
	if b.fresh {
		s.svcByKey.all(func(k NamespacedHostname, svc *Service) { b.setEndpoints(k, svc) })
	} else {
		for k := range b.touched {
			b.setEndpoints(k, b.svcByKey.get(k))
		}
	}
	if len(b.cidrNew) > 0 || len(b.cidrGone) > 0 {
		var list []cidrVIP
		for _, c := range s.cidrVIPs {
			if _, gone := b.cidrGone[c.svc]; !gone {
				list = append(list, c)
			}
		}
		for _, svc := range b.cidrNew {
			for _, p := range svc.CIDRVIPs {
				list = append(list, cidrVIP{p, svc})
			}
		}
		// Stable: a service's CIDR VIPs keep their order.
		slices.SortStableFunc(list, func(x, y cidrVIP) int { return cmpServices(x.svc, y.svc) })
		s.cidrVIPs = list
	}
	b.byUID.finish()
	b.byAddr.finish()
	b.byInfo.finish()
	b.byHost.finish()
	b.svcByKey.finish()
	b.svcByVIP.finish()
	b.svcByHost.finish()
	b.members.finish()
	b.endpoints.finish()
}

// setEndpoints derives the endpoints of the service under key (nil: none)
// from the workloads naming it. When every one of them is an endpoint, the
// list is shared with members.
func (b *builder) setEndpoints(key NamespacedHostname, svc *Service) {
	if svc == nil {
		b.endpoints.del(key)
		return
	}
	m := b.members.get(key)
	n := 0
	for _, e := range m {
		if svc.includes(e.Workload) {
			n++
		}
	}
	switch n {
	case 0:
		b.endpoints.del(key)
		return
	case len(m):
		b.endpoints.set(key, m)
		return
	}
	eps := make([]Endpoint, 0, n)
	for _, e := range m {
		if svc.includes(e.Workload) {
			eps = append(eps, e)
		}
	}
	b.endpoints.set(key, eps)
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

// findWarnings lists the problems Warnings reports.
func (s *Snapshot) findWarnings() []string {
	var out []string
	for _, w := range s.Workloads() {
		for _, k := range w.AuthorizationPolicies {
			if s.pol.lookup(k) == nil {
				out = append(out, fmt.Sprintf("workload %q lists unknown authorization policy %q; skipping it", w.UID, k))
			}
		}
	}
	return out
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
