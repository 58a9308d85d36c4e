package state

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
)

// Writer is the one writer of a Store: it holds the proxy's configuration as
// tables (workloads by uid, services by key, policies by resource name), on
// top of an optional static base, and after every Update builds the next
// Snapshot from the last one by a delta and publishes it. Building happens in
// the caller's goroutine (the xDS client's); the data path only ever Loads
// finished snapshots.
//
// Semantics follow ztunnel's proxy state:
//
//   - A workload may list services that have not arrived yet: its endpoints
//     are kept with the workload and join the service when it arrives (and
//     leave it when the workload goes), since every snapshot derives the
//     endpoints from the workloads.
//   - Two workloads claiming one address on one network are both kept, and
//     the address resolves to one of them, ranked as ztunnel ranks them: a
//     Kubernetes pod ("//Pod/" in its uid) over anything else, then HBONE
//     over plain TCP, then the most recently updated. The others are
//     published without that address.
//   - The base loads first, into the same tables: later upserts with the
//     same keys replace its entries, and removals remove them.
//
// Writer is safe for concurrent use; updates are serialized. It knows no
// wire format: converting resources and naming rejections is its caller's
// job (package state/xdsconv).
type Writer struct {
	store *Store
	logf  func(string, ...any)

	mu sync.Mutex // serializes updates; guards the following fields
	// workloads holds every workload by uid.
	workloads map[string]*workloadEntry
	// services holds every service by namespace/hostname.
	services map[string]*Service
	// policies holds every policy by resource name, and policyKeys the
	// resource name that owns each namespace/name key.
	policies   map[string]*Policy
	policyKeys map[string]string
	// addrs indexes every indexed (non host-network) workload address held
	// by one workload, and conflicts those held by more than one (in the
	// order they came), resolved when a snapshot is built. An address is in
	// one of the two. Conflicts are rare, so the common case holds no list
	// (issue 36: a one-entry list cost ~100 B per workload).
	addrs     map[NetworkAddress]*workloadEntry
	conflicts map[NetworkAddress][]*workloadEntry
	// seq counts workload updates, to rank the most recent first.
	seq uint64
	// last is the last snapshot built; the dirty sets hold the workload
	// uids, service keys and policy keys that may differ from it, so that
	// the next snapshot is derived from it by a delta (Snapshot.Apply).
	last                   *Snapshot
	dirtyW, dirtyS, dirtyP map[string]struct{}
}

// Base is the static configuration a Writer starts from (a local config
// file): policies are held under their namespace/name key as resource name.
type Base struct {
	Workloads []*Workload
	Services  []*Service
	Policies  []*Policy
}

// workloadEntry is a workload with its update sequence number.
type workloadEntry struct {
	w   *Workload
	seq uint64
}

// NewWriter returns a Writer publishing to store, seeded with base (which
// may be nil; the Writer takes ownership of its values), and publishes the
// seeded snapshot. It fails if base is not a valid snapshot on its own
// (NewSnapshot's error, unwrapped): duplicates in a base are mistakes, not
// updates. logf (nil: discard) receives address conflicts and rebuild
// failures.
func NewWriter(store *Store, base *Base, logf func(string, ...any)) (*Writer, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	w := &Writer{
		store:      store,
		logf:       logf,
		workloads:  map[string]*workloadEntry{},
		services:   map[string]*Service{},
		policies:   map[string]*Policy{},
		policyKeys: map[string]string{},
		addrs:      map[NetworkAddress]*workloadEntry{},
		conflicts:  map[NetworkAddress][]*workloadEntry{},
		dirtyW:     map[string]struct{}{},
		dirtyS:     map[string]struct{}{},
		dirtyP:     map[string]struct{}{},
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if base != nil {
		if _, err := NewSnapshot(base.Workloads, base.Services, base.Policies); err != nil {
			return nil, err
		}
		for _, wl := range base.Workloads {
			w.putWorkloadLocked(wl, nil)
		}
		for _, s := range base.Services {
			w.services[s.Key()] = s
		}
		for _, p := range base.Policies {
			w.policies[p.Key()] = p
			w.policyKeys[p.Key()] = p.Key()
		}
	}
	snap, err := w.buildLocked()
	if err != nil {
		return nil, err
	}
	store.Publish(snap)
	return w, nil
}

// Tx is one update in progress: the changes a push makes, applied to the
// Writer's tables as they are made and published together when the Update
// that handed out the Tx returns. A Tx is valid only inside that Update.
type Tx struct {
	w *Writer
	// undos revert the upserts, newest last, should the build fail.
	undos []func()
}

// Update runs fn with the Writer's lock held, then builds the next
// snapshot and publishes it. Should the build fail (every check NewSnapshot
// makes is also made by the converters, so this is a safety net), the
// upserts fn made are reverted, its removals kept, the reverted state is
// published if it builds, and the build error is returned: every upsert
// was refused with it.
func (w *Writer) Update(fn func(tx *Tx)) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	tx := &Tx{w: w}
	fn(tx)
	tx.w = nil // the Tx ends with fn
	snap, err := w.buildLocked()
	if err == nil {
		w.store.Publish(snap)
		return nil
	}
	w.logf("xds: building the snapshot failed, reverting %d resource(s): %v", len(tx.undos), err)
	for i := len(tx.undos) - 1; i >= 0; i-- {
		tx.undos[i]()
	}
	if snap, err2 := w.buildLocked(); err2 == nil {
		w.store.Publish(snap)
	} else {
		w.logf("xds: rebuilding after the revert failed too; keeping the previous snapshot: %v", err2)
	}
	return err
}

// PutWorkload inserts or replaces the workload with wl's uid.
func (tx *Tx) PutWorkload(wl *Workload) { tx.w.putWorkloadLocked(wl, &tx.undos) }

// RemoveWorkload removes the workload with uid and reports whether there
// was one.
func (tx *Tx) RemoveWorkload(uid string) bool {
	if tx.w.workloads[uid] == nil {
		return false
	}
	tx.w.removeWorkloadLocked(uid)
	return true
}

// PutService inserts or replaces the service with s's key.
func (tx *Tx) PutService(s *Service) {
	w := tx.w
	key := s.Key()
	prev := w.services[key]
	w.services[key] = s
	w.dirtyS[key] = struct{}{}
	tx.undos = append(tx.undos, func() {
		w.dirtyS[key] = struct{}{}
		if prev != nil {
			w.services[key] = prev
		} else {
			delete(w.services, key)
		}
	})
}

// RemoveService removes the service with key, if any.
func (tx *Tx) RemoveService(key string) {
	delete(tx.w.services, key)
	tx.w.dirtyS[key] = struct{}{}
}

// PutPolicy inserts or replaces the policy held under resource name. A
// policy's namespace/name key has one owner: if another resource name holds
// p's key, nothing changes and PutPolicy returns that name and false.
func (tx *Tx) PutPolicy(name string, p *Policy) (owner string, ok bool) {
	w := tx.w
	key := p.Key()
	if owner, held := w.policyKeys[key]; held && owner != name {
		return owner, false
	}
	prev := w.policies[name]
	w.removePolicyLocked(name)
	w.policies[name] = p
	w.policyKeys[key] = name
	w.dirtyP[key] = struct{}{}
	tx.undos = append(tx.undos, func() {
		w.removePolicyLocked(name)
		if prev != nil {
			w.policies[name] = prev
			w.policyKeys[prev.Key()] = name
			w.dirtyP[prev.Key()] = struct{}{}
		}
	})
	return "", true
}

// RemovePolicy removes the policy held under resource name, if any.
func (tx *Tx) RemovePolicy(name string) { tx.w.removePolicyLocked(name) }

// Counts returns how many workloads, services and policies are held.
func (w *Writer) Counts() (workloads, services, policies int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.workloads), len(w.services), len(w.policies)
}

// putWorkloadLocked inserts or replaces wl; with undos non-nil it records
// how to revert that.
func (w *Writer) putWorkloadLocked(wl *Workload, undos *[]func()) {
	prev := w.workloads[wl.UID]
	w.removeWorkloadLocked(wl.UID)
	w.seq++
	e := &workloadEntry{w: wl, seq: w.seq}
	w.workloads[wl.UID] = e
	for _, k := range indexedAddrs(wl) {
		if first := w.addOwnerLocked(k, e); first != nil {
			w.logf("xds: workload %q shares address %s with %q; ranking decides which one the address resolves to",
				wl.UID, k, first.w.UID)
		}
	}
	w.dirtyW[wl.UID] = struct{}{}
	if undos != nil {
		*undos = append(*undos, func() {
			w.removeWorkloadLocked(wl.UID)
			if prev != nil {
				w.restoreWorkloadLocked(prev)
			}
		})
	}
}

// restoreWorkloadLocked puts back an entry removed by an update being
// reverted.
func (w *Writer) restoreWorkloadLocked(e *workloadEntry) {
	w.workloads[e.w.UID] = e
	for _, k := range indexedAddrs(e.w) {
		w.addOwnerLocked(k, e)
	}
	w.dirtyW[e.w.UID] = struct{}{}
}

// addOwnerLocked adds e to the workloads holding k and marks them dirty
// (the change may move the address from one of them to another). It
// returns the first workload that held k before, if any.
func (w *Writer) addOwnerLocked(k NetworkAddress, e *workloadEntry) (first *workloadEntry) {
	if list, ok := w.conflicts[k]; ok {
		w.conflicts[k] = append(list, e)
		w.markLocked(list)
		return list[0]
	}
	if o := w.addrs[k]; o != nil {
		delete(w.addrs, k)
		w.conflicts[k] = []*workloadEntry{o, e}
		w.dirtyW[o.w.UID] = struct{}{}
		return o
	}
	w.addrs[k] = e
	return nil
}

// removeOwnerLocked removes e from the workloads holding k and marks the
// others dirty.
func (w *Writer) removeOwnerLocked(k NetworkAddress, e *workloadEntry) {
	list, ok := w.conflicts[k]
	if !ok {
		if w.addrs[k] == e {
			delete(w.addrs, k)
		}
		return
	}
	list = slices.DeleteFunc(list, func(o *workloadEntry) bool { return o == e })
	w.markLocked(list)
	if len(list) == 1 {
		delete(w.conflicts, k)
		w.addrs[k] = list[0]
		return
	}
	w.conflicts[k] = list
}

// markLocked marks dirty the workloads sharing an address with a changed
// one: the change may move the address from one of them to another.
func (w *Writer) markLocked(list []*workloadEntry) {
	for _, o := range list {
		w.dirtyW[o.w.UID] = struct{}{}
	}
}

func (w *Writer) removeWorkloadLocked(uid string) {
	e := w.workloads[uid]
	if e == nil {
		return
	}
	delete(w.workloads, uid)
	w.dirtyW[uid] = struct{}{}
	for _, k := range indexedAddrs(e.w) {
		w.removeOwnerLocked(k, e)
	}
}

func (w *Writer) removePolicyLocked(name string) {
	p := w.policies[name]
	if p == nil {
		return
	}
	delete(w.policies, name)
	w.dirtyP[p.Key()] = struct{}{}
	if w.policyKeys[p.Key()] == name {
		delete(w.policyKeys, p.Key())
	}
}

// indexedAddrs returns the distinct keys under which w is found by address.
func indexedAddrs(w *Workload) []NetworkAddress {
	if w.NetworkMode == NetworkModeHostNetwork || len(w.Addresses) == 0 {
		return nil
	}
	keys := make([]NetworkAddress, 0, len(w.Addresses))
	for _, ip := range w.Addresses {
		k := NetworkAddress{Network: w.Network, Addr: ip.Unmap()}
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
	if e.w.Protocol == ProtocolHBONE {
		hbone = 1
	}
	return [3]uint64{pod, hbone, e.seq}
}

// winner returns the workload an address shared by list resolves to.
func winner(list []*workloadEntry) *workloadEntry {
	return slices.MaxFunc(list, func(a, b *workloadEntry) int {
		ra, rb := rank(a), rank(b)
		return slices.Compare(ra[:], rb[:])
	})
}

// withoutAddrs returns w itself if lost is empty, else a copy of w without
// the addresses in lost (unmapped): a workload published without the
// addresses it loses to another workload.
func withoutAddrs(w *Workload, lost []netip.Addr) *Workload {
	if lost == nil {
		return w
	}
	cp := *w
	cp.Addresses = slices.DeleteFunc(slices.Clone(w.Addresses), func(ip netip.Addr) bool {
		return slices.Contains(lost, ip.Unmap())
	})
	return &cp
}

// buildLocked builds a snapshot of everything held: the first one from
// scratch, the next ones from the last by a delta of what is dirty.
// Workloads that lose an address conflict are replaced by copies without
// that address.
func (w *Writer) buildLocked() (*Snapshot, error) {
	var (
		snap *Snapshot
		err  error
	)
	if w.last == nil {
		snap, err = w.buildFullLocked()
	} else {
		snap, err = w.last.Apply(w.deltaLocked())
	}
	if err != nil {
		return nil, err
	}
	w.last = snap
	resetDirty(&w.dirtyW)
	resetDirty(&w.dirtyS)
	resetDirty(&w.dirtyP)
	return snap, nil
}

// dirtyKeep is the most entries a dirty set may have held for clear to
// empty it; a larger one is replaced by a new map.
const dirtyKeep = 64

// resetDirty empties the dirty set *m. clear keeps a map's table, and
// ranging over a map visits its whole table however few entries it holds:
// a set that took a 100,000-workload push made every later delta walk
// 100,000 empty slots (issue 36: a tenth of the daemon's CPU under churn).
func resetDirty(m *map[string]struct{}) {
	if len(*m) > dirtyKeep {
		*m = map[string]struct{}{}
		return
	}
	clear(*m)
}

// deltaLocked returns the change from the last snapshot to what is held.
func (w *Writer) deltaLocked() Delta {
	var d Delta
	for uid := range w.dirtyW {
		if e := w.workloads[uid]; e != nil {
			d.Workloads = append(d.Workloads, w.publishedLocked(e))
		} else {
			d.RemovedWorkloads = append(d.RemovedWorkloads, uid)
		}
	}
	for key := range w.dirtyS {
		if s := w.services[key]; s != nil {
			d.Services = append(d.Services, s)
		} else {
			d.RemovedServices = append(d.RemovedServices, key)
		}
	}
	for key := range w.dirtyP {
		if name, ok := w.policyKeys[key]; ok {
			d.Policies = append(d.Policies, w.policies[name])
		} else {
			d.RemovedPolicies = append(d.RemovedPolicies, key)
		}
	}
	return d
}

// publishedLocked returns e's workload as a snapshot holds it: a copy
// without the addresses it loses to another workload, if any.
func (w *Writer) publishedLocked(e *workloadEntry) *Workload {
	var lost []netip.Addr
	for _, k := range indexedAddrs(e.w) {
		if list, c := w.conflicts[k]; c && winner(list) != e {
			lost = append(lost, k.Addr)
		}
	}
	return withoutAddrs(e.w, lost)
}

// buildFullLocked builds a snapshot of everything held from scratch.
func (w *Writer) buildFullLocked() (*Snapshot, error) {
	var lost map[*workloadEntry][]netip.Addr
	for k, list := range w.conflicts {
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

	workloads := make([]*Workload, 0, len(w.workloads))
	for _, e := range w.workloads {
		workloads = append(workloads, withoutAddrs(e.w, lost[e]))
	}
	services := make([]*Service, 0, len(w.services))
	for _, s := range w.services {
		services = append(services, s)
	}
	policies := make([]*Policy, 0, len(w.policies))
	for _, p := range w.policies {
		policies = append(policies, p)
	}
	return NewSnapshot(workloads, services, policies)
}
