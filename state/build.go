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

	byUID     *shardEdit[hashed, *Workload] // written with setUID, delUID
	byAddr    addrEdit[*Workload]
	byInfo    *shardEdit[hashed, *Workload]
	byInfoM   *shardEdit[infoKey, []*Workload]
	byHost    *shardEdit[NamespacedHostname, []*Workload]
	svcByKey  *shardEdit[hashed, *Service] // written with setFunc, delFunc
	svcByVIP  addrEdit[[1]*Service]
	svcByVIPM addrEdit[[]*Service]
	svcByHost *shardEdit[string, [1]*Service]
	svcHostM  *shardEdit[string, []*Service]
	svcEps    *shardEdit[NamespacedHostname, svcMembers]

	// touched holds the service keys whose endpoints an edit must derive
	// again (a fresh build derives those of every service).
	touched map[NamespacedHostname]struct{}
	// cidrGone and cidrNew are the services whose CIDR VIPs leave and join
	// the snapshot's list.
	cidrGone map[*Service]struct{}
	cidrNew  []*Service
	// ownNets says whether s.nets is the builder's own copy (netID).
	ownNets bool
}

// newBuilder returns a builder of s: a fresh one sized for nw workloads and
// ns services, or one editing the indexes s holds, copied from a previous
// snapshot. The hash given to each edit is the one its lookups use.
func newBuilder(s *Snapshot, fresh bool, nw, ns int) *builder {
	return &builder{
		s:         s,
		fresh:     fresh,
		byUID:     newShardEdit(&s.byUID, nil, fresh, nw),
		byAddr:    newAddrEdit(&s.byAddr, fresh, nw),
		byInfo:    newShardEdit(&s.byInfo, nil, fresh, nw), // written by hash: setH, delH
		byInfoM:   newShardEdit(&s.byInfoMulti, hashInfo, fresh, 0),
		byHost:    newShardEdit(&s.byHost, hashNH, fresh, 0),
		svcByKey:  newShardEdit(&s.svcByKey, nil, fresh, ns),
		svcByVIP:  newAddrEdit(&s.svcByVIP, fresh, ns),
		svcByVIPM: newAddrEdit(&s.svcByVIPMany, fresh, 0),
		svcByHost: newShardEdit(&s.svcByHost, hashString, fresh, ns),
		svcHostM:  newShardEdit(&s.svcByHostMany, hashString, fresh, 0),
		svcEps:    newShardEdit(&s.svcEps, hashNH, fresh, ns),
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
		if serviceByKey(b.svcByKey.m, key) != nil {
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
		if workloadByUID(b.byUID.m, w.UID) != nil {
			b.fail("workload %q: duplicate uid", w.UID)
			continue
		}
		b.setUID(w)
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
	for _, p := range svc.CIDRVIPs() {
		if !p.Prefix.IsValid() || p.Prefix.Addr().Zone() != "" {
			b.fail("%s: invalid CIDR VIP %q", what, p.String())
		}
	}
	b.checkGateway(what, "waypoint", svc.Waypoint)
	for j := range svc.WeightedWaypoints() {
		b.checkGateway(what, "weighted waypoint "+strconv.Itoa(j), &svc.WeightedWaypoints()[j].Destination)
	}
	if lb := svc.LoadBalancer(); lb != nil {
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
	b.svcByKey.setFunc(hashNH(key), keyIs(key), svc)
	for _, vip := range svc.VIPs {
		// A VIP listed twice is indexed once: insertSorted keeps the first.
		b.insertVIP(NetworkAddress{vip.Network, vip.Addr.Unmap()}, svc)
	}
	if len(svc.CIDRVIPs()) > 0 {
		b.cidrNew = append(b.cidrNew, svc)
	}
	insertService(b.svcByHost, b.svcHostM, svc.Hostname, svc)
	b.touch(key)
}

// unindexService removes svc, indexed, from the service indexes.
func (b *builder) unindexService(svc *Service) {
	key := NamespacedHostname{svc.Namespace, svc.Hostname}
	b.svcByKey.delFunc(hashNH(key), keyIs(key))
	for _, vip := range svc.VIPs {
		b.removeVIP(NetworkAddress{vip.Network, vip.Addr.Unmap()}, svc)
	}
	if len(svc.CIDRVIPs()) > 0 {
		b.cidrGone[svc] = struct{}{}
	}
	removeService(b.svcByHost, b.svcHostM, svc.Hostname, svc)
	b.touch(key)
}

// checkWorkloadKey reports whether the i-th workload can be indexed at all.
func (b *builder) checkWorkloadKey(i int, w *Workload) bool {
	if w == nil {
		b.fail("workload %d is nil", i)
		return false
	}
	if w.UID == "" {
		b.fail("workload %d (%s/%s): uid is empty", i, w.Namespace(), w.Name)
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
	if t := w.ApplicationTunnel(); t != nil && t.Protocol > AppTunnelProxy {
		b.fail("%s: invalid application tunnel protocol %d", what, t.Protocol)
	}
	b.checkGateway(what, "waypoint", w.Waypoint())
	b.checkGateway(what, "network gateway", w.NetworkGateway())
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
		k := NetworkAddress{w.Network(), ip.Unmap()}
		if other := b.getAddr(k); other != nil && other != w {
			first, second := other, w
			if first.UID > second.UID {
				first, second = second, first
			}
			b.fail("address %s is used by two workloads: %q and %q", k.String(), first.UID, second.UID)
			continue
		}
		b.setAddr(k, w)
	}
	b.indexInfo(w)
	if w.Hostname() != "" {
		insertSorted(b.byHost, NamespacedHostname{w.Namespace(), w.Hostname()}, w, cmpWorkloads)
	}
	for i, sp := range w.Services.List() {
		k := sp.Key
		ns, host, ok := strings.Cut(k, "/")
		if !ok {
			b.fail("%s: service key %q is not namespace/hostname", what, k)
			continue
		}
		// Endpoints of unknown services are unreachable: ztunnel stages
		// them until the service arrives, which for us is the snapshot
		// that brings it (members keeps them until then).
		nh := NamespacedHostname{ns, host}
		b.addMember(nh, Endpoint{Workload: w, svc: uint32(i)})
		b.touch(nh)
	}
}

// setUID puts w in byUID, in place of the workload with its UID.
func (b *builder) setUID(w *Workload) {
	b.byUID.setFunc(hashString(w.UID), uidIs(w.UID), w)
}

// unindexWorkload removes w, indexed, from every workload index.
func (b *builder) unindexWorkload(w *Workload) {
	b.byUID.delFunc(hashString(w.UID), uidIs(w.UID))
	if w.NetworkMode != NetworkModeHostNetwork {
		for _, ip := range w.Addresses {
			if k := (NetworkAddress{w.Network(), ip.Unmap()}); b.getAddr(k) == w {
				b.delAddr(k)
			}
		}
	}
	b.unindexInfo(w)
	if w.Hostname() != "" {
		removeSorted(b.byHost, NamespacedHostname{w.Namespace(), w.Hostname()}, w, cmpWorkloads)
	}
	for _, sp := range w.Services.List() {
		if ns, host, ok := strings.Cut(sp.Key, "/"); ok {
			nh := NamespacedHostname{ns, host}
			b.removeMember(nh, w)
			b.touch(nh)
		}
	}
}

// indexInfo adds w to byInfo, or to byInfoMulti when another workload
// has its namespace and name hash.
func (b *builder) indexInfo(w *Workload) {
	k := infoKeyOf(w.Namespace(), w.Name)
	h := hashInfo(k)
	if b.byInfoM.get(k) != nil {
		insertSorted(b.byInfoM, k, w, cmpWorkloads)
		return
	}
	switch o := b.byInfo.m.get(h, hashed{}); {
	case o == nil:
		b.byInfo.setH(h, hashed{}, w)
	case o != w:
		b.byInfo.delH(h, hashed{})
		list := []*Workload{o, w}
		slices.SortFunc(list, cmpWorkloads)
		b.byInfoM.ownsValue(k)
		b.byInfoM.set(k, list)
	}
}

// unindexInfo removes w, indexed, from byInfo or byInfoMulti; the last
// workload of a list goes back to byInfo.
func (b *builder) unindexInfo(w *Workload) {
	k := infoKeyOf(w.Namespace(), w.Name)
	h := hashInfo(k)
	if b.byInfoM.get(k) == nil {
		if b.byInfo.m.get(h, hashed{}) == w {
			b.byInfo.delH(h, hashed{})
		}
		return
	}
	removeSorted(b.byInfoM, k, w, cmpWorkloads)
	if list := b.byInfoM.get(k); len(list) == 1 {
		b.byInfoM.del(k)
		b.byInfo.setH(h, hashed{}, list[0])
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
		// The member lists grew by appending; trimmed, they are ~1/3
		// smaller (issue 36: ~10 bytes per workload). An edit copies a
		// list it changes to its exact size anyway.
		s.svcEps.update(func(v svcMembers) svcMembers {
			if cap(v.members) != len(v.members) {
				v.members = append([]Endpoint(nil), v.members...)
			}
			return v
		})
		s.svcByKey.all(func(_ hashed, svc *Service) { b.setEndpoints(NamespacedHostname{svc.Namespace, svc.Hostname}, svc) })
	} else {
		for k := range b.touched {
			b.setEndpoints(k, serviceByKey(b.svcByKey.m, k))
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
			for _, p := range svc.CIDRVIPs() {
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
	b.byInfoM.finish()
	b.byHost.finish()
	b.svcByKey.finish()
	b.svcByVIP.finish()
	b.svcByVIPM.finish()
	b.svcByHost.finish()
	b.svcHostM.finish()
	b.svcEps.finish()
}

// addMember adds ep to the members of the service under key.
func (b *builder) addMember(key NamespacedHostname, ep Endpoint) {
	v := b.svcEps.get(key)
	i, found := slices.BinarySearchFunc(v.members, ep, cmpEndpoints)
	if found {
		return
	}
	// The endpoints list may be the members list; it is derived again in
	// finish, after every member change, so an owned members list may
	// change in place.
	if b.svcEps.ownsValue(key) {
		v.members = slices.Insert(v.members, i, ep)
	} else {
		n := make([]Endpoint, len(v.members)+1)
		copy(n, v.members[:i])
		n[i] = ep
		copy(n[i+1:], v.members[i:])
		v.members = n
	}
	b.svcEps.set(key, v)
}

// removeMember removes w from the members of the service under key.
func (b *builder) removeMember(key NamespacedHostname, w *Workload) {
	v := b.svcEps.get(key)
	i, found := slices.BinarySearchFunc(v.members, Endpoint{Workload: w}, cmpEndpoints)
	switch {
	case !found:
		return
	case len(v.members) == 1:
		v.members = nil
	case b.svcEps.ownsValue(key):
		v.members = slices.Delete(v.members, i, i+1)
	default:
		n := make([]Endpoint, len(v.members)-1)
		copy(n, v.members[:i])
		copy(n[i:], v.members[i+1:])
		v.members = n
	}
	b.putMembers(key, v)
}

// putMembers stores v under key, or removes the key when v is empty.
func (b *builder) putMembers(key NamespacedHostname, v svcMembers) {
	if v.members == nil && v.endpoints == nil {
		b.svcEps.del(key)
		return
	}
	b.svcEps.set(key, v)
}

// setEndpoints derives the endpoints of the service under key (nil: none)
// from the workloads naming it. When every one of them is an endpoint, the
// list is shared with members.
func (b *builder) setEndpoints(key NamespacedHostname, svc *Service) {
	v := b.svcEps.get(key)
	v.endpoints = nil
	if svc != nil {
		// Keyed by the service's own strings, which Endpoints(svc) passes:
		// the lookup's key compares by pointer (the members' keys are cut
		// from the workloads' service keys).
		key = NamespacedHostname{svc.Namespace, svc.Hostname}
		m := v.members
		n := 0
		for _, e := range m {
			if svc.includes(e.Workload) {
				n++
			}
		}
		switch n {
		case 0:
		case len(m):
			v.endpoints = m
		default:
			v.endpoints = make([]Endpoint, 0, n)
			for _, e := range m {
				if svc.includes(e.Workload) {
					v.endpoints = append(v.endpoints, e)
				}
			}
		}
	}
	b.putMembers(key, v)
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
		for _, k := range w.AuthorizationPolicies() {
			if s.pol.lookup(k) == nil {
				out = append(out, fmt.Sprintf("workload %q lists unknown authorization policy %q; skipping it", w.UID, k))
			}
		}
	}
	return out
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
