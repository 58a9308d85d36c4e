package xdsconv

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/xdsclient"
)

// XDSState is the proxy's configuration as the control plane pushes it: it
// holds the converted Address and Authorization resources (on top of an
// optional static local config) and, after every push, builds the next
// state.Snapshot and publishes it to a state.Store. Building happens in the
// xDS client's goroutine; the data path only ever Loads finished snapshots.
//
// Semantics follow ztunnel's proxy state:
//
//   - Workloads are keyed by uid, services by namespace/hostname (both taken
//     from the resource content), policies by resource name. A removal names
//     a workload uid or a service key.
//   - A workload may list services that have not arrived yet: its endpoints
//     are kept with the workload and join the service when it arrives (and
//     leave it when the workload goes), since every snapshot derives the
//     endpoints from the workloads.
//   - Resources that do not convert are rejected one by one, and the rest of
//     the push is applied; the previous version of a rejected resource stays.
//   - Two workloads claiming one address on one network are both kept, and
//     the address resolves to one of them, ranked as ztunnel ranks them: a
//     Kubernetes pod ("//Pod/" in its uid) over anything else, then HBONE
//     over plain TCP, then the most recently updated. The others are
//     published without that address.
//   - A static local config loads first, into the same tables: xDS resources
//     with the same keys replace its entries, and xDS removals remove them.
//
// XDSState is safe for concurrent use; applies are serialized.
type XDSState struct {
	store *state.Store
	logf  func(string, ...any)

	mu sync.Mutex // serializes applies; guards the following fields
	// workloads holds every workload by uid.
	workloads map[string]*workloadEntry
	// services holds every service by namespace/hostname.
	services map[string]*state.Service
	// policies holds every policy by resource name, and policyKeys the
	// resource name that owns each namespace/name key.
	policies   map[string]*state.Policy
	policyKeys map[string]string
	// addrs indexes every indexed (non host-network) workload address; a
	// list longer than one is a conflict, resolved when a snapshot is built.
	addrs map[state.NetworkAddress][]*workloadEntry
	// conflicts holds the keys of addrs with more than one workload.
	conflicts map[state.NetworkAddress]struct{}
	// seq counts workload updates, to rank the most recent first.
	seq uint64
	// last is the last snapshot built; the dirty sets hold the workload
	// uids, service keys and policy keys that may differ from it, so that
	// the next snapshot is derived from it by a delta (state.Snapshot.Apply).
	last                   *state.Snapshot
	dirtyW, dirtyS, dirtyP map[string]struct{}
}

// workloadEntry is a workload with its update sequence number.
type workloadEntry struct {
	w   *state.Workload
	seq uint64
}

// NewXDSState returns an XDSState publishing to store, seeded with static
// (which may be nil; XDSState takes ownership of its values), and publishes
// the seeded snapshot. It fails if static is not a valid config on its own.
// logf (nil: discard) receives address conflicts and rebuild failures.
func NewXDSState(store *state.Store, static *LocalConfig, logf func(string, ...any)) (*XDSState, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	x := &XDSState{
		store:      store,
		logf:       logf,
		workloads:  map[string]*workloadEntry{},
		services:   map[string]*state.Service{},
		policies:   map[string]*state.Policy{},
		policyKeys: map[string]string{},
		addrs:      map[state.NetworkAddress][]*workloadEntry{},
		conflicts:  map[state.NetworkAddress]struct{}{},
		dirtyW:     map[string]struct{}{},
		dirtyS:     map[string]struct{}{},
		dirtyP:     map[string]struct{}{},
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if static != nil {
		// Validate as a whole first: duplicates in a file are mistakes.
		if _, err := static.Snapshot(); err != nil {
			return nil, err
		}
		for _, w := range static.Workloads {
			x.putWorkloadLocked(w, nil)
		}
		for _, s := range static.Services {
			x.services[s.Key()] = s
		}
		for _, p := range static.Policies {
			x.policies[p.Key()] = p
			x.policyKeys[p.Key()] = p.Key()
		}
	}
	snap, err := x.buildLocked()
	if err != nil {
		return nil, err
	}
	store.Publish(snap)
	return x, nil
}

// Register registers the Address and Authorization handlers with c.
func (x *XDSState) Register(c *xdsclient.Client) {
	c.Register(AddressType, xdsclient.HandlerFunc(x.HandleAddresses))
	c.Register(AuthorizationType, xdsclient.HandlerFunc(x.HandleAuthorizations))
}

// undo records how to revert one change of an apply.
type undo func()

// HandleAddresses applies a push of Address resources (an xdsclient
// Handler): it converts every resource, applies the valid ones and the
// removals, publishes the new snapshot, and returns the rejected resources.
func (x *XDSState) HandleAddresses(u *xdsclient.Update) []xdsclient.Rejection {
	type converted struct {
		w   *state.Workload
		s   *state.Service
		err error
	}
	out := make([]converted, len(u.Resources))
	convertAll(len(u.Resources), func(i int) {
		a := &workloadapi.Address{}
		if err := proto.Unmarshal(u.Resources[i].Value.GetValue(), a); err != nil {
			out[i].err = fmt.Errorf("%w: decoding Address: %w", ErrInvalidResource, err)
			return
		}
		out[i].w, out[i].s, out[i].err = ConvertAddress(a)
	})

	x.mu.Lock()
	defer x.mu.Unlock()
	// Upserts first, then removals, in ztunnel's order.
	var (
		rej   []xdsclient.Rejection
		undos []undo
		names = make([]string, 0, len(out))
	)
	for i, c := range out {
		name := u.Resources[i].Name
		switch {
		case c.err != nil:
			rej = append(rej, xdsclient.Rejection{Name: name, Err: c.err})
			continue
		case c.w != nil:
			x.putWorkloadLocked(c.w, &undos)
		default:
			x.putServiceLocked(c.s, &undos)
		}
		names = append(names, name)
	}
	for _, name := range u.Removed {
		x.removeAddressLocked(name)
	}
	return append(rej, x.publishLocked(undos, names)...)
}

// HandleAuthorizations applies a push of Authorization resources (an
// xdsclient Handler), like HandleAddresses.
func (x *XDSState) HandleAuthorizations(u *xdsclient.Update) []xdsclient.Rejection {
	type converted struct {
		p   *state.Policy
		err error
	}
	out := make([]converted, len(u.Resources))
	convertAll(len(u.Resources), func(i int) {
		a := &securityapi.Authorization{}
		if err := proto.Unmarshal(u.Resources[i].Value.GetValue(), a); err != nil {
			out[i].err = fmt.Errorf("%w: decoding Authorization: %w", ErrInvalidResource, err)
			return
		}
		out[i].p, out[i].err = ConvertAuthorization(a)
	})

	x.mu.Lock()
	defer x.mu.Unlock()
	var (
		rej   []xdsclient.Rejection
		undos []undo
		names = make([]string, 0, len(out))
	)
	for i, c := range out {
		name := u.Resources[i].Name
		err := c.err
		if err == nil {
			err = x.putPolicyLocked(name, c.p, &undos)
		}
		if err != nil {
			rej = append(rej, xdsclient.Rejection{Name: name, Err: err})
			continue
		}
		names = append(names, name)
	}
	for _, name := range u.Removed {
		x.removePolicyLocked(name)
	}
	return append(rej, x.publishLocked(undos, names)...)
}

// parallelMin is the push size from which decoding and conversion are
// spread over the CPUs; below it the goroutines cost more than they save.
const parallelMin = 512

// convertAll calls convert(i) for every i in [0, n), in parallel for large
// n. The goroutines end before it returns.
func convertAll(n int, convert func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n/parallelMin)
	if workers < 2 {
		for i := range n {
			convert(i)
		}
		return
	}
	var wg sync.WaitGroup
	chunk := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				convert(i)
			}
		})
	}
	wg.Wait()
}

// publishLocked builds and publishes the snapshot. Should the build fail
// (every check NewSnapshot makes is also made by the conversion, so this is
// a safety net), the upserts are reverted, the removals kept, and every
// upserted resource is rejected with the error.
func (x *XDSState) publishLocked(undos []undo, upserted []string) []xdsclient.Rejection {
	snap, err := x.buildLocked()
	if err == nil {
		x.store.Publish(snap)
		return nil
	}
	x.logf("xds: building the snapshot failed, reverting %d resource(s): %v", len(upserted), err)
	for i := len(undos) - 1; i >= 0; i-- {
		undos[i]()
	}
	if snap, err2 := x.buildLocked(); err2 == nil {
		x.store.Publish(snap)
	} else {
		x.logf("xds: rebuilding after the revert failed too; keeping the previous snapshot: %v", err2)
	}
	rej := make([]xdsclient.Rejection, len(upserted))
	for i, n := range upserted {
		rej[i] = xdsclient.Rejection{Name: n, Err: err}
	}
	return rej
}

// removeAddressLocked removes what an Address resource name names: a
// workload uid, else a service key (ztunnel's order).
func (x *XDSState) removeAddressLocked(name string) {
	if x.workloads[name] != nil {
		x.removeWorkloadLocked(name)
		return
	}
	if _, host, ok := strings.Cut(name, "/"); !ok || strings.Contains(host, "/") {
		return // not a service key (workload uids often contain '/')
	}
	delete(x.services, name)
	x.dirtyS[name] = struct{}{}
}

func (x *XDSState) putWorkloadLocked(w *state.Workload, undos *[]undo) {
	prev := x.workloads[w.UID]
	x.removeWorkloadLocked(w.UID)
	x.seq++
	e := &workloadEntry{w: w, seq: x.seq}
	x.workloads[w.UID] = e
	for _, k := range indexedAddrs(w) {
		list := x.addrs[k]
		if len(list) > 0 {
			x.logf("xds: workload %q shares address %s with %q; ranking decides which one the address resolves to",
				w.UID, k, list[0].w.UID)
			x.conflicts[k] = struct{}{}
		}
		x.addrs[k] = append(list, e)
		x.markLocked(x.addrs[k])
	}
	x.dirtyW[w.UID] = struct{}{}
	if undos != nil {
		*undos = append(*undos, func() {
			x.removeWorkloadLocked(w.UID)
			if prev != nil {
				x.restoreWorkloadLocked(prev)
			}
		})
	}
}

// restoreWorkloadLocked puts back an entry removed by an apply being reverted.
func (x *XDSState) restoreWorkloadLocked(e *workloadEntry) {
	x.workloads[e.w.UID] = e
	for _, k := range indexedAddrs(e.w) {
		x.addrs[k] = append(x.addrs[k], e)
		if len(x.addrs[k]) > 1 {
			x.conflicts[k] = struct{}{}
		}
		x.markLocked(x.addrs[k])
	}
	x.dirtyW[e.w.UID] = struct{}{}
}

// markLocked marks dirty the workloads sharing an address with a changed
// one: the change may move the address from one of them to another.
func (x *XDSState) markLocked(list []*workloadEntry) {
	for _, o := range list {
		x.dirtyW[o.w.UID] = struct{}{}
	}
}

func (x *XDSState) removeWorkloadLocked(uid string) {
	e := x.workloads[uid]
	if e == nil {
		return
	}
	delete(x.workloads, uid)
	x.dirtyW[uid] = struct{}{}
	for _, k := range indexedAddrs(e.w) {
		list := slices.DeleteFunc(x.addrs[k], func(o *workloadEntry) bool { return o == e })
		x.markLocked(list)
		switch len(list) {
		case 0:
			delete(x.addrs, k)
		case 1:
			delete(x.conflicts, k)
			fallthrough
		default:
			x.addrs[k] = list
		}
	}
}

func (x *XDSState) putServiceLocked(s *state.Service, undos *[]undo) {
	key := s.Key()
	prev := x.services[key]
	x.services[key] = s
	x.dirtyS[key] = struct{}{}
	*undos = append(*undos, func() {
		x.dirtyS[key] = struct{}{}
		if prev != nil {
			x.services[key] = prev
		} else {
			delete(x.services, key)
		}
	})
}

// errDuplicatePolicyKey rejects a policy whose namespace/name is already
// held under another resource name.
var errDuplicatePolicyKey = fmt.Errorf("%w: another resource holds a policy with this namespace/name", ErrInvalidResource)

func (x *XDSState) putPolicyLocked(name string, p *state.Policy, undos *[]undo) error {
	key := p.Key()
	if owner, held := x.policyKeys[key]; held && owner != name {
		return fmt.Errorf("%w (%s: %s)", errDuplicatePolicyKey, key, owner)
	}
	prev := x.policies[name]
	x.removePolicyLocked(name)
	x.policies[name] = p
	x.policyKeys[key] = name
	x.dirtyP[key] = struct{}{}
	*undos = append(*undos, func() {
		x.removePolicyLocked(name)
		if prev != nil {
			x.policies[name] = prev
			x.policyKeys[prev.Key()] = name
			x.dirtyP[prev.Key()] = struct{}{}
		}
	})
	return nil
}

func (x *XDSState) removePolicyLocked(name string) {
	p := x.policies[name]
	if p == nil {
		return
	}
	delete(x.policies, name)
	x.dirtyP[p.Key()] = struct{}{}
	if x.policyKeys[p.Key()] == name {
		delete(x.policyKeys, p.Key())
	}
}

// indexedAddrs returns the distinct keys under which w is found by address.
func indexedAddrs(w *state.Workload) []state.NetworkAddress {
	if w.NetworkMode == state.NetworkModeHostNetwork || len(w.Addresses) == 0 {
		return nil
	}
	keys := make([]state.NetworkAddress, 0, len(w.Addresses))
	for _, ip := range w.Addresses {
		k := state.NetworkAddress{Network: w.Network, Addr: ip.Unmap()}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// rank orders workloads sharing an address, as ztunnel does: pods first,
// then HBONE, then the most recently updated.
func rank(e *workloadEntry) [3]uint64 {
	var pod, hbone uint64
	if strings.Contains(e.w.UID, "//Pod/") {
		pod = 1
	}
	if e.w.Protocol == state.ProtocolHBONE {
		hbone = 1
	}
	return [3]uint64{pod, hbone, e.seq}
}

// buildLocked builds a snapshot of everything held: the first one from
// scratch, the next ones from the last by a delta of what is dirty.
// Workloads that lose an address conflict are replaced by copies without
// that address.
func (x *XDSState) buildLocked() (*state.Snapshot, error) {
	var (
		snap *state.Snapshot
		err  error
	)
	if x.last == nil {
		snap, err = x.buildFullLocked()
	} else {
		snap, err = x.last.Apply(x.deltaLocked())
	}
	if err != nil {
		return nil, fmt.Errorf("xdsconv: %w", err)
	}
	x.last = snap
	clear(x.dirtyW)
	clear(x.dirtyS)
	clear(x.dirtyP)
	return snap, nil
}

// deltaLocked returns the change from the last snapshot to what is held.
func (x *XDSState) deltaLocked() state.Delta {
	var d state.Delta
	for uid := range x.dirtyW {
		if e := x.workloads[uid]; e != nil {
			d.Workloads = append(d.Workloads, x.publishedLocked(e))
		} else {
			d.RemovedWorkloads = append(d.RemovedWorkloads, uid)
		}
	}
	for key := range x.dirtyS {
		if s := x.services[key]; s != nil {
			d.Services = append(d.Services, s)
		} else {
			d.RemovedServices = append(d.RemovedServices, key)
		}
	}
	for key := range x.dirtyP {
		if name, ok := x.policyKeys[key]; ok {
			d.Policies = append(d.Policies, x.policies[name])
		} else {
			d.RemovedPolicies = append(d.RemovedPolicies, key)
		}
	}
	return d
}

// publishedLocked returns e's workload as a snapshot holds it: a copy
// without the addresses it loses to another workload, if any.
func (x *XDSState) publishedLocked(e *workloadEntry) *state.Workload {
	var lost []netip.Addr
	for _, k := range indexedAddrs(e.w) {
		if _, c := x.conflicts[k]; c && winner(x.addrs[k]) != e {
			lost = append(lost, k.Addr)
		}
	}
	if lost == nil {
		return e.w
	}
	cp := *e.w
	cp.Addresses = slices.DeleteFunc(slices.Clone(e.w.Addresses), func(ip netip.Addr) bool {
		return slices.Contains(lost, ip.Unmap())
	})
	return &cp
}

// winner returns the workload an address shared by list resolves to.
func winner(list []*workloadEntry) *workloadEntry {
	return slices.MaxFunc(list, func(a, b *workloadEntry) int {
		ra, rb := rank(a), rank(b)
		return slices.Compare(ra[:], rb[:])
	})
}

// buildFullLocked builds a snapshot of everything held from scratch.
func (x *XDSState) buildFullLocked() (*state.Snapshot, error) {
	var lost map[*workloadEntry][]netip.Addr
	for k := range x.conflicts {
		list := x.addrs[k]
		win := winner(list)
		if lost == nil {
			lost = map[*workloadEntry][]netip.Addr{}
		}
		for _, e := range list {
			if e != win {
				lost[e] = append(lost[e], k.Addr)
			}
		}
	}

	workloads := make([]*state.Workload, 0, len(x.workloads))
	for _, e := range x.workloads {
		w := e.w
		if l := lost[e]; l != nil {
			cp := *w
			cp.Addresses = slices.DeleteFunc(slices.Clone(w.Addresses), func(ip netip.Addr) bool {
				return slices.Contains(l, ip.Unmap())
			})
			w = &cp
		}
		workloads = append(workloads, w)
	}
	services := make([]*state.Service, 0, len(x.services))
	for _, s := range x.services {
		services = append(services, s)
	}
	policies := make([]*state.Policy, 0, len(x.policies))
	for _, p := range x.policies {
		policies = append(policies, p)
	}
	return state.NewSnapshot(workloads, services, policies)
}

// Counts returns how many workloads, services and policies are held.
func (x *XDSState) Counts() (workloads, services, policies int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.workloads), len(x.services), len(x.policies)
}
