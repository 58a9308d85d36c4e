package state

import (
	"errors"
	"hash/maphash"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
)

// ErrInvalid is wrapped by every error NewSnapshot returns.
var ErrInvalid = errors.New("state: invalid snapshot")

// maxErrors bounds how many problems NewSnapshot reports at once.
const maxErrors = 20

// svcMembers are a service key's workloads. members lists every workload
// naming the service in its Services (sorted by UID), whether or not the
// service exists or takes it as an endpoint, so that a service arriving or
// changing its health policy finds its endpoints without a scan;
// endpoints lists those of them that are the service's endpoints (sorted
// by UID; members itself when they all are).
type svcMembers struct {
	members, endpoints []Endpoint
}

// Endpoint is one workload serving a service.
type Endpoint struct {
	Workload *Workload
	svc      uint32 // the service's index in Workload.Services
}

// Ports returns the endpoint's port map for the service (service port ->
// target port).
func (e *Endpoint) Ports() PortMap { return e.Workload.Services.list[e.svc].Ports }

// Snapshot is an immutable view of workloads, services and policies with the
// indexes the data path needs. It is immutable once created: every method is
// safe for concurrent use, and slices and values it returns are shared and
// must not be modified.
//
// The indexes are sharded maps, so that Apply can derive the next snapshot
// from this one by copying only what a change touches (see shardmap.go).
type Snapshot struct {
	// byUID is keyed by hash alone: a probe compares the workload's own
	// UID (workloadByUID).
	byUID  shardMap[hashed, *Workload]
	byAddr addrIndex[*Workload]
	// byInfo holds, by the hash of its namespace and name (infoKeyOf),
	// each workload that is the only one with that hash; the hashes of two
	// or more are in byInfoMulti instead, with their workloads sorted by
	// UID. A pair has one workload but for a hash collision or one name in
	// two clusters, so the common case has no list (issue 36: a list cost
	// a slice header in the slot and an allocation, ~45 bytes a workload).
	byInfo      shardMap[hashed, *Workload]
	byInfoMulti shardMap[infoKey, []*Workload]
	// byHost indexes hostname-only workloads by namespace and hostname,
	// sorted by UID: the first (lowest UID) wins a tie.
	byHost shardMap[NamespacedHostname, []*Workload]

	// svcByKey is keyed by hash alone: a probe compares the service's own
	// namespace and hostname (serviceByKey).
	svcByKey shardMap[hashed, *Service]
	// svcByVIP and svcByHost hold a key's service, or manyServices and
	// then the key's list in svcByVIPMany, svcByHostMany, sorted by key
	// (servicesAt).
	svcByVIP      addrIndex[[1]*Service]
	svcByVIPMany  addrIndex[[]*Service]
	svcByHost     shardMap[string, [1]*Service]
	svcByHostMany shardMap[string, []*Service]
	cidrVIPs      []cidrVIP // by service key, then in the service's order
	// svcEps holds, by service key, the members and endpoints lists
	// (svcMembers) in one slot (issue 36: two indexes of lists cost ~60
	// bytes more per service).
	svcEps shardMap[NamespacedHostname, svcMembers]

	// nets gives the networks of the address indexes their handles.
	nets *netTable

	// pol is the compiled policy table, shared with the snapshots derived
	// by WithWorkloads and by Apply without a policy change.
	pol *policyTable

	workloads lazyList[*Workload] // sorted by UID
	services  lazyList[*Service]  // sorted by key
	warnings  lazyList[string]
}

// infoKey is the hash of a workload's namespace and name that byInfo and
// byInfoMulti are keyed by. Pairs with one hash share an entry, which
// FindWorkload filters by namespace and name (issue 36: a key of the two
// strings cost 24 more bytes per slot, ~40 per workload).
type infoKey uint64

func infoKeyOf(ns, name string) infoKey {
	return infoKey(nonzero(maphash.String(shardSeed, name) ^ bits.RotateLeft64(maphash.String(shardSeed, ns), 29)))
}

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
// from the workloads' Services; unhealthy workloads are left out unless
// the service's health policy is LBAllowAll.
//
// It rejects duplicate workload UIDs, service keys and policy keys, two
// workloads with the same address on one network (ztunnel would keep both and
// pick one by rank; a snapshot has one owner per address), and out-of-range
// or malformed values. All problems found (up to a limit) are joined in the
// error, each wrapping ErrInvalid.
func NewSnapshot(workloads []*Workload, services []*Service, policies []*Policy) (*Snapshot, error) {
	b := buildFresh(workloads, services)
	pol := reusableTable(policies)
	if pol == nil {
		valid := b.checkPolicies(policies)
		if len(b.errs) == 0 {
			pol = compilePolicies(valid)
		}
	}
	return b.done(pol)
}

// WithWorkloads returns a snapshot with the given workloads and services and
// s's policies, validated and indexed as NewSnapshot does. The new snapshot
// shares s's compiled policy table, so it has the same PolicyGeneration and
// costs nothing to compile. A converter uses it for an update that carries no
// policy (an Address push in xDS), so that watchers of policy changes, such
// as the connection manager, are not woken for nothing.
func (s *Snapshot) WithWorkloads(workloads []*Workload, services []*Service) (*Snapshot, error) {
	return buildFresh(workloads, services).done(s.pol)
}

// PolicyGeneration identifies the snapshot's policy set, so that a watcher
// can tell a policy change from a workload-only update in O(1).
//
// The contract: snapshots with the same generation have the same policies
// and make the same Authorize decision for the same Conn. WithWorkloads, and
// Apply given a delta without policies, carry the generation over, and every
// snapshot without policies has generation 0. NewSnapshot given exactly the
// same *Policy values as the previous NewSnapshot with policies (in any
// order) reuses its compiled table and generation (and Apply keeps its
// snapshot's when the delta's policies are the very values it holds and it
// removes none it holds); otherwise it compiles a table with a new
// generation, larger than any before it, even for policies equal to an
// earlier snapshot's. So a different generation means the policies may have
// changed, not that they did.
//
// A converter therefore builds with WithWorkloads or Apply when an update
// carries no policy (an Address push), or keeps its Policy values from one
// update to the next, and open connections are re-checked only on
// Authorization pushes, as in ztunnel.
func (s *Snapshot) PolicyGeneration() uint64 { return s.pol.gen }

// Workloads returns every workload, sorted by UID.
func (s *Snapshot) Workloads() []*Workload {
	return s.workloads.get(func() []*Workload {
		list := make([]*Workload, 0, s.byUID.n)
		s.byUID.all(func(_ hashed, w *Workload) { list = append(list, w) })
		slices.SortFunc(list, cmpWorkloads)
		return list
	})
}

// EachWorkload calls fn for every workload, in no order: a scan that needs
// neither the sorted list Workloads builds nor its memory.
func (s *Snapshot) EachWorkload(fn func(*Workload)) {
	s.byUID.all(func(_ hashed, w *Workload) { fn(w) })
}

// Services returns every service, sorted by key.
func (s *Snapshot) Services() []*Service {
	return s.services.get(func() []*Service {
		list := make([]*Service, 0, s.svcByKey.n)
		s.svcByKey.all(func(_ hashed, svc *Service) { list = append(list, svc) })
		sortByKey(list, (*Service).Key)
		return list
	})
}

// Policies returns every policy, sorted by key.
func (s *Snapshot) Policies() []*Policy { return s.pol.list() }

// Warnings returns problems that did not prevent building the snapshot, such
// as a workload listing a policy key the snapshot lacks. Callers log them once
// when they publish the snapshot.
func (s *Snapshot) Warnings() []string { return s.warnings.get(s.findWarnings) }

// WorkloadByUID returns the workload with the given UID, or nil.
func (s *Snapshot) WorkloadByUID(uid string) *Workload { return workloadByUID(&s.byUID, uid) }

// workloadByUID returns the workload of m, an index by UID, with the given
// UID, or nil. It and serviceByKey write out the probe that the Writer's
// edits make through findFunc: a lookup compares in line rather than
// through a closure call per probed slot.
func workloadByUID(m *shardMap[hashed, *Workload], uid string) *Workload {
	h := hashString(uid)
	i := h >> m.shift
	t := m.pages[i>>pageBits][i&(pageShards-1)]
	t = t[:cap(t)]
	if n := uint64(len(t)); n > 0 {
		for i := home(h, n); t[i].h != 0; i = next(i, n) {
			if t[i].h == h && t[i].v.UID == uid {
				return t[i].v
			}
		}
	}
	return nil
}

// uidIs returns the test findFunc needs for the workload with the given
// UID in an index by UID.
func uidIs(uid string) func(*Workload) bool {
	return func(w *Workload) bool { return w.UID == uid }
}

// WorkloadByAddr returns the workload that owns ip on network, or nil.
// Host-network workloads are never returned: their addresses are the node's.
func (s *Snapshot) WorkloadByAddr(network string, ip netip.Addr) *Workload {
	id, ip, ok := s.lookupAddr(network, ip)
	if !ok {
		return nil
	}
	return s.byAddr.get(id, ip)
}

// ServiceByKey returns the service with key "namespace/hostname", or nil.
func (s *Snapshot) ServiceByKey(key string) *Service {
	ns, host, ok := strings.Cut(key, "/")
	if !ok {
		return nil
	}
	return serviceByKey(&s.svcByKey, NamespacedHostname{ns, host})
}

// serviceByKey returns the service of m, an index by key, with key k, or
// nil.
func serviceByKey(m *shardMap[hashed, *Service], k NamespacedHostname) *Service {
	h := hashNH(k)
	i := h >> m.shift
	t := m.pages[i>>pageBits][i&(pageShards-1)]
	t = t[:cap(t)]
	if n := uint64(len(t)); n > 0 {
		for i := home(h, n); t[i].h != 0; i = next(i, n) {
			if v := t[i].v; t[i].h == h && v.Hostname == k.Hostname && v.Namespace == k.Namespace {
				return v
			}
		}
	}
	return nil
}

// keyIs returns the test findFunc needs for the service with key k in an
// index by key.
func keyIs(k NamespacedHostname) func(*Service) bool {
	return func(s *Service) bool { return s.Hostname == k.Hostname && s.Namespace == k.Namespace }
}

// ServicesByHostname returns the services with the given hostname (one per
// namespace at most), sorted by key.
func (s *Snapshot) ServicesByHostname(host string) []*Service {
	return servicesAt(&s.svcByHost, &s.svcByHostMany, hashString(host), host)
}

// servicesByVIP returns the services with the exact VIP ip (unmapped) on
// the network of handle id, sorted by key.
func (s *Snapshot) servicesByVIP(id uint32, ip netip.Addr) []*Service {
	if ip.Is4() {
		k := addr4Key(id, ip)
		return servicesAt(&s.svcByVIP.v4, &s.svcByVIPMany.v4, hashAddr4(k), k)
	}
	k := addr6KeyOf(id, ip)
	return servicesAt(&s.svcByVIP.v6, &s.svcByVIPMany.v6, hashAddr6(k), k)
}

// ServiceByVIP returns the service with the exact VIP ip on network, or nil.
// When several services share the VIP, a canonical one wins, then the first
// by key. Clients that know their namespace use ResolveVIP instead.
func (s *Snapshot) ServiceByVIP(network string, ip netip.Addr) *Service {
	id, ip, ok := s.lookupAddr(network, ip)
	if !ok {
		return nil
	}
	return bestService(s.servicesByVIP(id, ip), "", "", false, nil)
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
	if id, ip, ok := s.lookupAddr(network, ip); ok {
		if svc := bestService(s.servicesByVIP(id, ip), clientNS, preferredNS, useNS, nil); svc != nil {
			return svc
		}
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
// then the first (by key). Without useNS, visibility is not checked; a
// non-nil keep skips the services it refuses.
func bestService(list []*Service, clientNS, preferredNS string, useNS bool, keep func(*Service) bool) *Service {
	var first, canonical, preferred *Service
	for _, svc := range list {
		if keep != nil && !keep(svc) {
			continue
		}
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
	k := NamespacedHostname{svc.Namespace, svc.Hostname}
	return s.svcEps.get(hashNH(k), k).endpoints
}

// WorkloadInfo identifies the workload a dedicated proxy serves
// (PROXY_WORKLOAD_INFO is "namespace/name/service-account").
type WorkloadInfo struct {
	Namespace, Name, ServiceAccount string
	// Node, when set, restricts the search to workloads on that node
	// (NODE_NAME: ztunnel's local_node).
	Node string
	// Cluster, when set, also excludes workloads of another cluster
	// (CLUSTER_ID): node names are unique only within a cluster, and a
	// multi-cluster control plane may send a same-named pod on a same-named
	// node of another one. Workloads without a cluster ID still match.
	Cluster string
}

// FindWorkload returns the workload matching info (service account compared
// after defaulting, as ztunnel does), or nil. If several match, the one with
// the lowest UID wins.
func (s *Snapshot) FindWorkload(info WorkloadInfo) *Workload {
	sa := info.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	k := infoKeyOf(info.Namespace, info.Name)
	if w := s.byInfo.get(hashInfo(k), hashed{}); w != nil {
		if info.matches(w, sa) {
			return w
		}
		return nil
	}
	for _, w := range s.byInfoMulti.get(hashInfo(k), k) {
		if info.matches(w, sa) {
			return w
		}
	}
	return nil
}

// matches reports whether w is the workload info names, sa being info's
// service account after defaulting.
func (info *WorkloadInfo) matches(w *Workload, sa string) bool {
	return w.Name == info.Name && w.Namespace() == info.Namespace &&
		(info.Node == "" || w.Node() == info.Node) && (info.Cluster == "" || w.ClusterID() == "" || w.ClusterID() == info.Cluster) &&
		w.Identity().ServiceAccount == sa
}

// DiffWorkloads calls fn for every workload s and prev differ in, in no
// order: fn(old, nil) for a workload prev holds and s lacks, fn(nil, cur)
// for one s adds, and fn(old, cur) when the UID's value is another
// *Workload (Apply puts a new value in place even when it is equal). A nil
// prev counts as empty.
//
// Its cost follows what changed when s derives from prev by Apply: the two
// share every index shard the deltas in between did not touch, and a shared
// shard is skipped without reading its entries. Otherwise (a snapshot
// built from scratch, an index re-split) it compares every workload, as a
// scan of both would. A watcher that keeps state per workload, such as the
// certificate warmer, follows a push at the cost of the push (issue 36).
func (s *Snapshot) DiffWorkloads(prev *Snapshot, fn func(old, cur *Workload)) {
	if prev == nil {
		s.EachWorkload(func(w *Workload) { fn(nil, w) })
		return
	}
	a, b := &prev.byUID, &s.byUID
	if a.shift != b.shift || len(a.pages) != len(b.pages) {
		b.all(func(_ hashed, w *Workload) {
			if old := workloadByUID(a, w.UID); old != w {
				fn(old, w)
			}
		})
		a.all(func(_ hashed, w *Workload) {
			if workloadByUID(b, w.UID) == nil {
				fn(w, nil)
			}
		})
		return
	}
	for p := range b.pages {
		pa, pb := a.pages[p], b.pages[p]
		if sameSlice(pa, pb) {
			continue
		}
		for i := range pb {
			ta, tb := pa[i], pb[i]
			if sameSlice(ta, tb) {
				continue
			}
			ta, tb = ta[:cap(ta)], tb[:cap(tb)]
			for _, sl := range tb {
				if sl.h == 0 {
					continue
				}
				var old *Workload
				if j := findFunc(ta, sl.h, uidIs(sl.v.UID)); j >= 0 {
					old = ta[j].v
				}
				if old != sl.v {
					fn(old, sl.v)
				}
			}
			for _, sl := range ta {
				if sl.h != 0 && findFunc(tb, sl.h, uidIs(sl.v.UID)) < 0 {
					fn(sl.v, nil)
				}
			}
		}
	}
}

// sameSlice reports whether a and b are the same slice (one backing array,
// one length and capacity): a shard or page an edit did not clone.
func sameSlice[E any](a, b []E) bool {
	return len(a) == len(b) && cap(a) == cap(b) && (cap(a) == 0 || &a[:1][0] == &b[:1][0])
}
