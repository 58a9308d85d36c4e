package state

import (
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
)

// A snapshot's indexes are shardMaps: hash tables split into a power-of-two
// number of small shards by the top bits of a key's hash. Snapshot.Apply
// copies the list of pages of shards, clones the pages (one slice header
// per shard) and the shards a change writes to; every other page and shard
// is shared with the snapshot it derives from.
//
// A shard is an open-addressing table of its own (linear probing, entries
// stored inline with their hash) rather than a Go map, so that a lookup
// hashes the key once and then reads one slice header and, in most cases,
// one cache line of slots: a Go map per shard cost a second hash of the key
// and three dependent loads (map header, table, group) before the slot.

// shardTarget is the number of entries per shard an index is sized for when
// it is built or re-split: small enough that cloning a shard costs a few
// microseconds, large enough that the list of shards stays short. An index
// that grew through deltas past shardGrowth times that per shard is re-split
// (an O(n) step once it has grown fourfold). Tests lower shardTarget to exercise
// many shards and re-splits on small sets.
var shardTarget = 64

const shardGrowth = 4

// minTable is the smallest table a shard holding entries gets.
const minTable = 4

// shardSeed seeds the hash of string keys and of network names.
var shardSeed = maphash.MakeSeed()

// nonzero keeps 0 free to mark an empty slot.
func nonzero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

func hashString(s string) uint64 { return nonzero(maphash.String(shardSeed, s)) }

func hashNH(k NamespacedHostname) uint64 { return hashString(k.Hostname) }

func hashInfo(k infoKey) uint64 { return uint64(k) }

// shardsFor returns the shard count for an index of n entries.
func shardsFor(n int) int {
	s := 1
	for s*shardTarget < n {
		s *= 2
	}
	return s
}

// tableFor returns the table size for n entries: the smallest of 4, 6, 8,
// 12, 16, 24, ... (2^k and 3·2^(k-1)) that keeps the load at most 3/4, so
// that probe sequences stay short and end. With powers of two alone, the
// shards of an index sat at a load of 3/8 for some sizes (100,000 entries
// among others: issue 36's mesh), which doubled the index's memory; the
// steps in between keep it above 1/2.
func tableFor(n int) int {
	for c := minTable; ; c *= 2 {
		if c*3 >= n*4 {
			return c
		}
		if c3 := c + c/2; c3*3 >= n*4 {
			return c3
		}
	}
}

// home is where the probe sequence of hash h starts in a table of size n:
// the low 32 bits of h scaled to [0, n) (a multiply rather than a modulo;
// the top bits pick the shard).
func home(h, n uint64) uint64 { return uint64(uint32(h)) * n >> 32 }

// next is the slot after i in a table of size n, cyclically.
func next(i, n uint64) uint64 {
	if i++; i == n {
		return 0
	}
	return i
}

// dist is how many slots a probe walks from a to b in a table of size n.
func dist(a, b, n uint64) uint64 {
	if b >= a {
		return b - a
	}
	return b + n - a
}

// slot is one entry of a shard's table; h is the key's hash, 0 in an empty
// slot (the hash functions never return 0).
type slot[K comparable, V any] struct {
	h uint64
	k K
	v V
}

// shardMap is one index of a snapshot. It is immutable once the snapshot is
// built; only a shardEdit writes to it, while it builds a snapshot.
//
// Shard i holds the keys whose hash h has h>>shift == i. Its table is a
// slice whose capacity is the table size (tableFor's; 0 for an empty
// shard) and whose length is the number of entries, so that the list of
// shards stays one slice header per shard; the slots are read through
// t[:cap(t)]. A key's probe sequence starts at slot home(h, size).
//
// The list of shards is paged: shard i is pages[i/pageShards][i%pageShards].
// An edit copies the list of pages and the pages it writes to, not the
// whole list (issue 36: at 100,000 workloads a flat list was 2,048 slice
// headers per index, ~190 KB copied and collected per one-workload change).
type shardMap[K comparable, V any] struct {
	pages [][][]slot[K, V] // each pageShards long, or all shards when fewer
	shift uint8            // 64 - log2(shards); 64 shifts every bit out
	n     int              // entries
}

// pageShards is the number of shards per page of a shardMap (a power of
// two): a page is 1.5 KB of slice headers, and an index of 100,000
// entries has 32 pages.
const (
	pageBits   = 6
	pageShards = 1 << pageBits
)

// newPages returns the pages of s empty shards (s a power of two).
func newPages[K comparable, V any](s int) [][][]slot[K, V] {
	pages := make([][][]slot[K, V], (s+pageShards-1)/pageShards)
	for p := range pages {
		pages[p] = make([][]slot[K, V], min(s, pageShards))
	}
	return pages
}

// shard returns shard i's table.
func (m *shardMap[K, V]) shard(i uint64) []slot[K, V] {
	return m.pages[i>>pageBits][i&(pageShards-1)]
}

// numShards returns the number of shards.
func (m *shardMap[K, V]) numShards() int { return 1 << (64 - m.shift) }

// get returns the value under k, whose hash is h; the caller hashes with
// the index's own hash function, so that the call inlines. It writes out
// ref's probe rather than calling it: through ref, WorkloadByAddr (per
// connection) measured 5-12% slower.
func (m *shardMap[K, V]) get(h uint64, k K) V {
	i := h >> m.shift
	t := m.pages[i>>pageBits][i&(pageShards-1)]
	t = t[:cap(t)]
	if n := uint64(len(t)); n > 0 {
		for i := home(h, n); t[i].h != 0; i = next(i, n) {
			if t[i].h == h && t[i].k == k {
				return t[i].v
			}
		}
	}
	var zero V
	return zero
}

// ref returns a pointer to the value under k, whose hash is h, in its
// slot, or nil: for a lookup that hands out a slice of it (a published
// index is never written to).
func (m *shardMap[K, V]) ref(h uint64, k K) *V {
	i := h >> m.shift
	t := m.pages[i>>pageBits][i&(pageShards-1)]
	t = t[:cap(t)]
	if n := uint64(len(t)); n > 0 {
		for i := home(h, n); t[i].h != 0; i = next(i, n) {
			if t[i].h == h && t[i].k == k {
				return &t[i].v
			}
		}
	}
	return nil
}

// all calls f for every entry, in no particular order.
func (m *shardMap[K, V]) all(f func(K, V)) {
	for _, page := range m.pages {
		for _, t := range page {
			for _, s := range t[:cap(t)] {
				if s.h != 0 {
					f(s.k, s.v)
				}
			}
		}
	}
}

// update replaces every value v by f(v), in place: only for an index its
// caller owns whole (a fresh build's).
func (m *shardMap[K, V]) update(f func(V) V) {
	for _, page := range m.pages {
		for _, t := range page {
			t = t[:cap(t)]
			for i := range t {
				if t[i].h != 0 {
					t[i].v = f(t[i].v)
				}
			}
		}
	}
}

// find returns the slot index of k (hash h) in table t (at full size), or -1.
func find[K comparable, V any](t []slot[K, V], h uint64, k K) int {
	n := uint64(len(t))
	if n == 0 {
		return -1
	}
	for i := home(h, n); t[i].h != 0; i = next(i, n) {
		if t[i].h == h && t[i].k == k {
			return int(i)
		}
	}
	return -1
}

// findFunc is find for an index whose values carry their key, such as
// the workloads by UID: its key type is hashed, so that a slot is the
// hash and the value, and is reports whether a value has the key sought
// (issue 36: a string key in each slot cost ~27 bytes per workload).
func findFunc[K comparable, V any](t []slot[K, V], h uint64, is func(V) bool) int {
	n := uint64(len(t))
	if n == 0 {
		return -1
	}
	for i := home(h, n); t[i].h != 0; i = next(i, n) {
		if t[i].h == h && is(t[i].v) {
			return int(i)
		}
	}
	return -1
}

// place puts s, whose key t lacks, in the first free slot of its probe
// sequence in t (at full size, with a free slot).
func place[K comparable, V any](t []slot[K, V], s slot[K, V]) {
	n := uint64(len(t))
	i := home(s.h, n)
	for t[i].h != 0 {
		i = next(i, n)
	}
	t[i] = s
}

// rehash returns t's entries in a new table of size entries' room.
func rehash[K comparable, V any](t []slot[K, V], size int) []slot[K, V] {
	nt := make([]slot[K, V], size)
	n := 0
	for _, s := range t[:cap(t)] {
		if s.h != 0 {
			place(nt, s)
			n++
		}
	}
	return nt[:n]
}

// shardEdit writes to the shardMap of a snapshot being built. A fresh edit
// builds a new index and owns everything in it. Otherwise the map starts as
// a copy of a previous snapshot's: its list of pages is copied on the first
// write, each page on the first write to one of its shards, each shard's
// table on its first write, and slice values on their first change (the
// edit tracks which ones it allocated and may therefore change in place).
type shardEdit[K comparable, V any] struct {
	m     *shardMap[K, V]
	hash  func(K) uint64
	fresh bool
	hint  int      // entries a fresh shard's table is sized for
	owned []uint64 // bitset of shards cloned by this edit; nil until the first write
	paged []uint64 // bitset of pages cloned by this edit
	mine  map[K]struct{}
}

// newShardEdit returns an edit of m: with fresh, m becomes an empty index
// sized for n entries; otherwise m must hold a copy of a previous
// snapshot's index, whose shards stay shared until written.
func newShardEdit[K comparable, V any](m *shardMap[K, V], hash func(K) uint64, fresh bool, n int) *shardEdit[K, V] {
	e := &shardEdit[K, V]{m: m, hash: hash, fresh: fresh}
	if fresh {
		s := shardsFor(n)
		m.pages, m.shift, m.n = newPages[K, V](s), shiftFor(s), 0
		e.hint = n / s
		return e
	}
	e.mine = map[K]struct{}{}
	return e
}

// shiftFor returns the shift that maps a hash to one of s shards.
func shiftFor(s int) uint8 { return uint8(64 - bits.TrailingZeros(uint(s))) }

func (e *shardEdit[K, V]) get(k K) V { return e.m.get(e.hash(k), k) }

// hashed is the key of an index keyed by its entries' hashes alone (its
// edit is written with setH and delH): a slot is then the hash and the
// value, nothing more.
type hashed struct{}

// writable returns shard i's table, which the edit may then change in
// place: a shared one is cloned first (the list of pages too, on the first
// write of the edit, and the shard's page on the first write to it), a
// missing one is made.
func (e *shardEdit[K, V]) writable(i uint64) *[]slot[K, V] {
	p := i >> pageBits
	switch {
	case e.fresh:
	case e.owned == nil:
		e.m.pages = slices.Clone(e.m.pages)
		e.owned = make([]uint64, (e.m.numShards()+63)/64)
		e.paged = make([]uint64, (len(e.m.pages)+63)/64)
		fallthrough
	case e.owned[i/64]&(1<<(i%64)) == 0:
		if e.paged[p/64]&(1<<(p%64)) == 0 {
			e.m.pages[p] = slices.Clone(e.m.pages[p])
			e.paged[p/64] |= 1 << (p % 64)
		}
		t := &e.m.pages[p][i&(pageShards-1)]
		if cap(*t) > 0 {
			nt := make([]slot[K, V], len(*t), cap(*t))
			copy(nt[:cap(*t)], (*t)[:cap(*t)])
			*t = nt
		}
		e.owned[i/64] |= 1 << (i % 64)
	}
	t := &e.m.pages[p][i&(pageShards-1)]
	if cap(*t) == 0 {
		*t = make([]slot[K, V], 0, tableFor(max(e.hint, 1)))
	}
	return t
}

func (e *shardEdit[K, V]) set(k K, v V) { e.setH(e.hash(k), k, v) }

// setH is set with k's hash given.
func (e *shardEdit[K, V]) setH(h uint64, k K, v V) {
	cur := e.m.shard(h >> e.m.shift)
	e.setAt(find(cur[:cap(cur)], h, k), slot[K, V]{h, k, v})
}

// setFunc sets v under hash h in an index whose values carry their key
// (see findFunc): it replaces the value is reports to be v's key's.
func (e *shardEdit[K, V]) setFunc(h uint64, is func(V) bool, v V) {
	cur := e.m.shard(h >> e.m.shift)
	var k K
	e.setAt(findFunc(cur[:cap(cur)], h, is), slot[K, V]{h, k, v})
}

// setAt puts s in its shard: at slot j, which holds its key, or, for j <
// 0, in a new slot.
func (e *shardEdit[K, V]) setAt(j int, s slot[K, V]) {
	i := s.h >> e.m.shift
	if j >= 0 {
		t := e.writable(i)
		// The key too: an equal key whose strings are the ones lookups
		// pass compares by pointer, without reading the bytes.
		(*t)[:cap(*t)][j] = s
		return
	}
	t := e.writable(i)
	if n := len(*t) + 1; n*4 > cap(*t)*3 {
		*t = rehash(*t, tableFor(n))
	}
	place((*t)[:cap(*t)], s)
	*t = (*t)[:len(*t)+1]
	e.m.n++
}

func (e *shardEdit[K, V]) del(k K) { e.delH(e.hash(k), k) }

// delH is del with k's hash given.
func (e *shardEdit[K, V]) delH(h uint64, k K) {
	cur := e.m.shard(h >> e.m.shift)
	e.delAt(h>>e.m.shift, find(cur[:cap(cur)], h, k))
}

// delFunc deletes the value under hash h that is reports to be the one
// sought, in an index whose values carry their key (see findFunc).
func (e *shardEdit[K, V]) delFunc(h uint64, is func(V) bool) {
	cur := e.m.shard(h >> e.m.shift)
	e.delAt(h>>e.m.shift, findFunc(cur[:cap(cur)], h, is))
}

// delAt deletes slot j of shard i (nothing for j < 0).
func (e *shardEdit[K, V]) delAt(i uint64, j int) {
	if j < 0 {
		return
	}
	t := e.writable(i)
	e.m.n--
	if len(*t) == 1 {
		*t = nil // the shard's last entry: drop the table
		return
	}
	// Backward-shift deletion: move each later entry of the run that may
	// sit in the hole up into it, so that no probe sequence breaks and no
	// tombstone is left behind.
	full := (*t)[:cap(*t)]
	n := uint64(len(full))
	hole := uint64(j)
	for at := next(hole, n); full[at].h != 0; at = next(at, n) {
		// The entry at at may move to hole unless its home slot lies
		// after the hole (cyclically, between hole and at).
		if dist(home(full[at].h, n), at, n) >= dist(hole, at, n) {
			full[hole] = full[at]
			hole = at
		}
	}
	full[hole] = slot[K, V]{}
	*t = (*t)[:len(*t)-1]
}

// ownsValue reports whether k's (slice) value was allocated by this edit,
// and marks it so from now on, for the caller is about to allocate it.
func (e *shardEdit[K, V]) ownsValue(k K) bool {
	if e.fresh {
		return true
	}
	if _, ok := e.mine[k]; ok {
		return true
	}
	e.mine[k] = struct{}{}
	return false
}

// finish re-splits an index that outgrew its shards.
func (e *shardEdit[K, V]) finish() {
	if e.m.n <= shardGrowth*shardTarget*e.m.numShards() {
		return
	}
	old := e.m.pages
	s := shardsFor(e.m.n)
	e.m.pages, e.m.shift = newPages[K, V](s), shiftFor(s)
	size := tableFor(e.m.n / s)
	for _, page := range old {
		for _, t := range page {
			for _, sl := range t[:cap(t)] {
				if sl.h == 0 {
					continue
				}
				i := sl.h >> e.m.shift
				nt := &e.m.pages[i>>pageBits][i&(pageShards-1)]
				switch n := len(*nt) + 1; {
				case cap(*nt) == 0:
					*nt = make([]slot[K, V], 0, size)
				case n*4 > cap(*nt)*3:
					*nt = rehash(*nt, tableFor(n))
				}
				place((*nt)[:cap(*nt)], sl)
				*nt = (*nt)[:len(*nt)+1]
			}
		}
	}
}

// The indexes of services by VIP and by hostname hold a key's service in
// its slot, as a one-element array that a lookup slices ([1]*Service),
// since nearly every key has one; a key that two or more services share
// holds manyServices instead, and its list, sorted by key, is in the
// index's list part (svcByVIPMany, svcByHostMany). Issue 36: a list per
// key cost a slice header in the slot and an 8-byte allocation, ~14 bytes
// per workload.

// manyServices marks a key of a service index with two or more services.
var manyServices = &Service{}

// servicesAt returns the services under k (hash h) in the index of one and
// many, sorted by key.
func servicesAt[K comparable](one *shardMap[K, [1]*Service], many *shardMap[K, []*Service], h uint64, k K) []*Service {
	p := one.ref(h, k)
	switch {
	case p == nil:
		return nil
	case p[0] == manyServices:
		return many.get(h, k)
	}
	return p[:]
}

// insertService adds svc to the services under k in the index of one and
// many; a service with svc's key already there is kept instead.
func insertService[K comparable](one *shardEdit[K, [1]*Service], many *shardEdit[K, []*Service], k K, svc *Service) {
	h := one.hash(k)
	p := one.m.ref(h, k)
	switch {
	case p == nil:
		one.setH(h, k, [1]*Service{svc})
	case p[0] == manyServices:
		insertSorted(many, k, svc, cmpServices)
	case cmpServices(p[0], svc) != 0:
		list := []*Service{p[0], svc}
		if cmpServices(svc, p[0]) < 0 {
			list[0], list[1] = svc, p[0]
		}
		many.ownsValue(k) // the list is this edit's own
		many.set(k, list)
		one.setH(h, k, [1]*Service{manyServices})
	}
}

// removeService removes the service with svc's key from those under k in
// the index of one and many.
func removeService[K comparable](one *shardEdit[K, [1]*Service], many *shardEdit[K, []*Service], k K, svc *Service) {
	h := one.hash(k)
	p := one.m.ref(h, k)
	switch {
	case p == nil:
		return
	case p[0] != manyServices:
		if cmpServices(p[0], svc) == 0 {
			one.delH(h, k)
		}
		return
	}
	removeSorted(many, k, svc, cmpServices)
	if list := many.get(k); len(list) == 1 {
		many.del(k)
		one.setH(h, k, [1]*Service{list[0]})
	}
}

// insertSorted inserts x into the list under k, kept sorted by cmp; an
// element equal to x already there is kept instead.
func insertSorted[K comparable, E any](e *shardEdit[K, []E], k K, x E, cmp func(a, b E) int) {
	list := e.get(k)
	i, found := slices.BinarySearchFunc(list, x, cmp)
	if found {
		return
	}
	if e.ownsValue(k) {
		list = slices.Insert(list, i, x)
	} else {
		n := make([]E, len(list)+1)
		copy(n, list[:i])
		n[i] = x
		copy(n[i+1:], list[i:])
		list = n
	}
	e.set(k, list)
}

// removeSorted removes the element equal to x by cmp from the list under k,
// and the key with its last element.
func removeSorted[K comparable, E any](e *shardEdit[K, []E], k K, x E, cmp func(a, b E) int) {
	list := e.get(k)
	i, found := slices.BinarySearchFunc(list, x, cmp)
	switch {
	case !found:
		return
	case len(list) == 1:
		e.del(k)
		return
	case e.ownsValue(k):
		list = slices.Delete(list, i, i+1)
	default:
		n := make([]E, len(list)-1)
		copy(n, list[:i])
		copy(n[i:], list[i+1:])
		list = n
	}
	e.set(k, list)
}

// lazyList is a list a snapshot computes on first use (Workloads, Services,
// Warnings of a snapshot derived by Apply), safely for concurrent readers.
type lazyList[T any] struct {
	once sync.Once
	v    []T
}

func (l *lazyList[T]) get(f func() []T) []T {
	l.once.Do(func() { l.v = f() })
	return l.v
}

// set fills the list now, for a builder that has it at hand.
func (l *lazyList[T]) set(v []T) { l.once.Do(func() { l.v = v }) }

// cmpWorkloads orders workloads by UID.
func cmpWorkloads(a, b *Workload) int { return cmpString(a.UID, b.UID) }

// cmpEndpoints orders endpoints by workload UID.
func cmpEndpoints(a, b Endpoint) int { return cmpString(a.Workload.UID, b.Workload.UID) }

// cmpServices orders services by key without building the keys.
func cmpServices(a, b *Service) int {
	return cmpJoined(a.Namespace, a.Hostname, b.Namespace, b.Hostname)
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// cmpJoined compares a1+"/"+a2 with b1+"/"+b2.
func cmpJoined(a1, a2, b1, b2 string) int {
	if a1 == b1 {
		return cmpString(a2, b2)
	}
	// The first difference lies in the namespaces or where one of them
	// ends and the '/' stands.
	n := min(len(a1), len(b1))
	for i := range n {
		if a1[i] != b1[i] {
			return cmpString(a1[i:i+1], b1[i:i+1])
		}
	}
	switch ca, cb := byteAt(a1, n), byteAt(b1, n); {
	case ca < cb:
		return -1
	case ca > cb:
		return 1
	}
	return cmpString(a1+"/"+a2, b1+"/"+b2) // a namespace holds a '/'
}

// byteAt returns s[i], or '/' (the separator that follows s) at len(s).
func byteAt(s string, i int) byte {
	if i == len(s) {
		return '/'
	}
	return s[i]
}
