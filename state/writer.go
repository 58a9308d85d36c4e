package state

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"sync"
)

// Writer is the one writer of a Store: it holds the proxy's configuration
// (workloads by uid, found in the last snapshot unless changed since;
// services by key and policies by resource name in tables), on top of an
// optional static base, and after every Update builds the next Snapshot
// from the last one by a delta and publishes it. Building happens in
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
	// The workloads held are the last snapshot's, except that pending
	// holds those changed since it was built (by uid; nil: removed) and
	// originals those it holds without an address they lost to another
	// workload (by uid, as they were put). The Writer keeps no table of
	// its own for the rest (issue 36: a map of 100,000 entries repeating
	// the snapshot's index cost ~70 B per workload).
	pending    map[string]*Workload
	originals  map[string]*Workload
	nWorkloads int
	// The services held are the last snapshot's, except that pendingS
	// holds those changed since it was built (by namespace/hostname; nil:
	// removed): no table of its own either (issue 36: ~80 B per service).
	pendingS  map[string]*Service
	nServices int
	// policies holds every policy by resource name, and policyKeys the
	// resource name that owns each namespace/name key.
	policies   map[string]*Policy
	policyKeys map[string]string
	// An indexed (non host-network) address held by one workload is found
	// in the last snapshot's address index, or in addrs when that changed
	// since (nil: no single holder); one held by more than one workload is
	// in conflicts, its holders in the order they were put (the last put
	// is the most recent), and resolved when a snapshot is built.
	// Conflicts are rare, so the common case holds no list, and the
	// Writer no address table of its own (issue 36: ~60 B per workload).
	addrs     map[NetworkAddress]*Workload
	conflicts map[NetworkAddress][]*Workload
	// last is the last snapshot built; pending, pendingS and dirtyP hold
	// the workloads, services and policy keys that may differ from it, so
	// that the next snapshot is derived from it by a delta
	// (Snapshot.Apply).
	last   *Snapshot
	dirtyP map[string]struct{}
}

// Base is the static configuration a Writer starts from (a local config
// file): policies are held under their namespace/name key as resource name.
type Base struct {
	Workloads []*Workload
	Services  []*Service
	Policies  []*Policy
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
		pending:    map[string]*Workload{},
		originals:  map[string]*Workload{},
		pendingS:   map[string]*Service{},
		policies:   map[string]*Policy{},
		policyKeys: map[string]string{},
		addrs:      map[NetworkAddress]*Workload{},
		conflicts:  map[NetworkAddress][]*Workload{},
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
			w.pendingS[s.Key()] = s
			w.nServices++
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
	if tx.w.workloadLocked(uid) == nil {
		return false
	}
	tx.w.removeWorkloadLocked(uid)
	return true
}

// PutService inserts or replaces the service with s's key.
func (tx *Tx) PutService(s *Service) {
	w := tx.w
	key := s.Key()
	prev := w.serviceLocked(key)
	w.pendingS[key] = s
	if prev == nil {
		w.nServices++
	}
	tx.undos = append(tx.undos, func() {
		w.pendingS[key] = prev // nil: removed, as it was
		if prev == nil {
			w.nServices--
		}
	})
}

// RemoveService removes the service with key, if any.
func (tx *Tx) RemoveService(key string) {
	w := tx.w
	if w.serviceLocked(key) == nil {
		return
	}
	w.pendingS[key] = nil
	w.nServices--
}

// serviceLocked returns the service held under key, or nil.
func (w *Writer) serviceLocked(key string) *Service {
	if s, ok := w.pendingS[key]; ok {
		return s
	}
	if w.last == nil {
		return nil
	}
	return w.last.ServiceByKey(key)
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
	return w.nWorkloads, w.nServices, len(w.policies)
}

// workloadLocked returns the workload held under uid, as it was put, or
// nil.
func (w *Writer) workloadLocked(uid string) *Workload {
	if wl, ok := w.pending[uid]; ok {
		return wl
	}
	if wl := w.originals[uid]; wl != nil {
		return wl
	}
	if w.last == nil {
		return nil
	}
	return w.last.WorkloadByUID(uid)
}

// holderLocked returns the one workload holding address k (which
// conflicts does not hold), or nil.
func (w *Writer) holderLocked(k NetworkAddress) *Workload {
	if wl, ok := w.addrs[k]; ok {
		return wl
	}
	if w.last == nil {
		return nil
	}
	if pub := w.last.WorkloadByAddr(k.Network, k.Addr); pub != nil {
		return w.workloadLocked(pub.UID)
	}
	return nil
}

// markLocked marks the workload under uid dirty: the next snapshot
// publishes it again.
func (w *Writer) markLocked(uid string) {
	if _, ok := w.pending[uid]; !ok {
		w.pending[uid] = w.workloadLocked(uid)
	}
}

// putWorkloadLocked inserts or replaces wl; with undos non-nil it records
// how to revert that.
func (w *Writer) putWorkloadLocked(wl *Workload, undos *[]func()) {
	prev := w.workloadLocked(wl.UID)
	w.removeWorkloadLocked(wl.UID)
	w.addWorkloadLocked(wl, true)
	if undos != nil {
		// Reverted, prev comes back as if put again: it ranks as the most
		// recently put among the workloads sharing an address with it.
		*undos = append(*undos, func() {
			w.removeWorkloadLocked(wl.UID)
			if prev != nil {
				w.addWorkloadLocked(prev, false)
			}
		})
	}
}

// addWorkloadLocked adds wl, whose uid is not held, as the most recently
// put workload; logConflicts says whether to log the addresses it shares.
func (w *Writer) addWorkloadLocked(wl *Workload, logConflicts bool) {
	w.pending[wl.UID] = wl
	w.nWorkloads++
	var buf [2]NetworkAddress
	for _, k := range indexedAddrs(buf[:0], wl) {
		if first := w.addOwnerLocked(k, wl); first != nil && logConflicts {
			w.logf("xds: workload %q shares address %s with %q; ranking decides which one the address resolves to",
				wl.UID, k, first.UID)
		}
	}
}

// addOwnerLocked adds wl to the workloads holding k and marks them dirty
// (the change may move the address from one of them to another). It
// returns the first workload that held k before, if any.
func (w *Writer) addOwnerLocked(k NetworkAddress, wl *Workload) (first *Workload) {
	if list, ok := w.conflicts[k]; ok {
		w.conflicts[k] = append(list, wl)
		w.markAllLocked(list)
		return list[0]
	}
	if o := w.holderLocked(k); o != nil {
		w.addrs[k] = nil
		w.conflicts[k] = []*Workload{o, wl}
		w.markLocked(o.UID)
		return o
	}
	w.addrs[k] = wl
	return nil
}

// removeOwnerLocked removes wl from the workloads holding k and marks the
// others dirty.
func (w *Writer) removeOwnerLocked(k NetworkAddress, wl *Workload) {
	list, ok := w.conflicts[k]
	if !ok {
		if w.holderLocked(k) == wl {
			w.addrs[k] = nil
		}
		return
	}
	list = slices.DeleteFunc(list, func(o *Workload) bool { return o == wl })
	w.markAllLocked(list)
	if len(list) == 1 {
		delete(w.conflicts, k)
		w.addrs[k] = list[0]
		return
	}
	w.conflicts[k] = list
}

// markAllLocked marks dirty the workloads sharing an address with a
// changed one: the change may move the address from one of them to
// another.
func (w *Writer) markAllLocked(list []*Workload) {
	for _, o := range list {
		w.markLocked(o.UID)
	}
}

func (w *Writer) removeWorkloadLocked(uid string) {
	old := w.workloadLocked(uid)
	if old == nil {
		return
	}
	// The addresses first: holderLocked finds their holder through uid.
	var buf [2]NetworkAddress
	for _, k := range indexedAddrs(buf[:0], old) {
		w.removeOwnerLocked(k, old)
	}
	w.pending[uid] = nil
	w.nWorkloads--
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

// indexedAddrs appends to keys the distinct keys under which w is found by
// address. Callers pass a small array of their own: a workload has one or
// two addresses, and a slice made here per put was garbage among the
// objects a push keeps.
func indexedAddrs(keys []NetworkAddress, w *Workload) []NetworkAddress {
	if w.NetworkMode == NetworkModeHostNetwork || len(w.Addresses) == 0 {
		return keys
	}
	for _, ip := range w.Addresses {
		k := NetworkAddress{Network: w.Network(), Addr: ip.Unmap()}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// winner returns the workload an address shared by list (in the order its
// holders were put) resolves to, ranked as ztunnel ranks them: pods first,
// then HBONE, then the most recently put.
func winner(list []*Workload) *Workload {
	rank := func(w *Workload) int {
		r := 0
		if strings.Contains(w.UID, "//Pod/") {
			r += 2
		}
		if w.Protocol == ProtocolHBONE {
			r++
		}
		return r
	}
	best, bestRank := list[0], rank(list[0])
	for _, wl := range list[1:] {
		if r := rank(wl); r >= bestRank {
			best, bestRank = wl, r
		}
	}
	return best
}

// maxLostAddrs is how many of a workload's addresses can be marked lost
// (lostAddrs' bits); a workload losing an address past them is published
// without it.
const maxLostAddrs = 8

// lostAddrs returns the bits of w's addresses that resolve to another
// workload (WorkloadExtra.lostAddrs).
func (w *Workload) lostAddrs() uint8 {
	if w.Extra == nil {
		return 0
	}
	return w.Extra.lostAddrs
}

// losesAddr reports whether w's Addresses[i] resolves to another workload.
func (w *Workload) losesAddr(i int) bool { return i < maxLostAddrs && w.lostAddrs()&(1<<i) != 0 }

// withoutAddrs returns w itself if lost is empty (and w marks none, as a
// copy of a published workload put back would), else a copy of w whose
// addresses in lost (unmapped) are marked lost to another workload: the
// copy keeps them, as a service endpoint is dialled on them, but the
// snapshot resolves them to the winner.
func withoutAddrs(w *Workload, lost []netip.Addr) *Workload {
	if lost == nil && w.lostAddrs() == 0 {
		return w
	}
	cp := *w
	var x WorkloadExtra // a copy of w's: the original may be shared
	if w.Extra != nil {
		x = *w.Extra
	}
	x.lostAddrs = 0
	cp.Addresses = make([]netip.Addr, 0, len(w.Addresses))
	for _, ip := range w.Addresses {
		if slices.Contains(lost, ip.Unmap()) {
			if len(cp.Addresses) >= maxLostAddrs {
				continue
			}
			x.lostAddrs |= 1 << len(cp.Addresses)
		}
		cp.Addresses = append(cp.Addresses, ip)
	}
	cp.SetExtra(x)
	return &cp
}

// buildLocked builds a snapshot of everything held: the first one from
// scratch, the next ones from the last by a delta of what is dirty.
// Workloads that lose an address conflict are replaced by copies with that
// address marked lost.
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
	resetDirty(&w.pending)
	resetDirty(&w.addrs)
	resetDirty(&w.pendingS)
	resetDirty(&w.dirtyP)
	return snap, nil
}

// dirtyKeep is the most entries a dirty set may have held for clear to
// empty it; a larger one is replaced by a new map.
const dirtyKeep = 64

// resetDirty empties the dirty set *m. clear keeps a map's table, and
// ranging over a map visits its whole table however few entries it holds:
// a set that took a 100,000-workload push made every later delta walk
// 100,000 empty slots (issue 36: a tenth of the daemon's CPU under churn),
// and would keep the push's table alive.
func resetDirty[K comparable, V any](m *map[K]V) {
	if len(*m) > dirtyKeep {
		*m = map[K]V{}
		return
	}
	clear(*m)
}

// deltaLocked returns the change from the last snapshot to what is held.
func (w *Writer) deltaLocked() Delta {
	var d Delta
	for uid, wl := range w.pending {
		if wl != nil {
			d.Workloads = append(d.Workloads, w.publishedLocked(wl))
		} else {
			d.RemovedWorkloads = append(d.RemovedWorkloads, uid)
			delete(w.originals, uid)
		}
	}
	for key, s := range w.pendingS {
		if s != nil {
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

// publishedLocked returns wl as a snapshot holds it: a copy with the
// addresses it loses to another workload marked lost, if any, which
// originals then records.
func (w *Writer) publishedLocked(wl *Workload) *Workload {
	var lost []netip.Addr
	var buf [2]NetworkAddress
	for _, k := range indexedAddrs(buf[:0], wl) {
		if list, c := w.conflicts[k]; c && winner(list) != wl {
			lost = append(lost, k.Addr)
		}
	}
	if lost == nil {
		delete(w.originals, wl.UID)
		return wl
	}
	w.originals[wl.UID] = wl
	return withoutAddrs(wl, lost)
}

// buildFullLocked builds a snapshot of everything held from scratch.
func (w *Writer) buildFullLocked() (*Snapshot, error) {
	held := make([]*Workload, 0, w.nWorkloads)
	for _, wl := range w.pending {
		if wl != nil {
			held = append(held, wl)
		}
	}
	if w.last != nil {
		w.last.byUID.all(func(_ hashed, pub *Workload) {
			uid := pub.UID
			if _, changed := w.pending[uid]; !changed {
				held = append(held, cmp.Or(w.originals[uid], pub))
			}
		})
	}
	workloads := make([]*Workload, 0, len(held))
	for _, wl := range held {
		workloads = append(workloads, w.publishedLocked(wl))
	}
	services := make([]*Service, 0, w.nServices)
	for _, s := range w.pendingS {
		if s != nil {
			services = append(services, s)
		}
	}
	if w.last != nil {
		w.last.svcByKey.all(func(_ hashed, s *Service) {
			if _, changed := w.pendingS[s.Key()]; !changed {
				services = append(services, s)
			}
		})
	}
	policies := make([]*Policy, 0, len(w.policies))
	for _, p := range w.policies {
		policies = append(policies, p)
	}
	return NewSnapshot(workloads, services, policies)
}
