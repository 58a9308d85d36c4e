package state

import (
	"encoding/binary"
	"hash/maphash"
	"maps"
	"math/bits"
	"slices"
	"sync"
)

// A snapshot's indexes are shardMaps: a Go map split into a power-of-two
// number of small maps by a hash of the key. Snapshot.Apply copies the list
// of shards (a few words per shardTarget entries) and clones only the shards
// a change writes to; every other shard is shared with the snapshot it
// derives from. A lookup costs one cheap hash more than a plain map.

// shardTarget is the number of entries per shard an index is sized for when
// it is built or re-split: small enough that cloning a shard costs a few
// microseconds, large enough that the list of shards stays short. An index
// that grew through deltas past shardGrowth times that per shard is re-split
// (an O(n) step once it has grown fourfold). Tests lower shardTarget to exercise
// many shards and re-splits on small sets.
var shardTarget = 64

const shardGrowth = 4

// shardSeed seeds the hash that picks a string key's shard.
var shardSeed = maphash.MakeSeed()

func hashString(s string) uint64 { return maphash.String(shardSeed, s) }

// hashAddr picks an address's shard from the address alone (the network
// name rarely differs). The multiplication and fold mix every bit into the
// low ones the shard index is taken from. IPv4 takes the short path: As16
// costs several times more than the rest.
func hashAddr(k NetworkAddress) uint64 {
	var x uint64
	if k.Addr.Is4() {
		a := k.Addr.As4()
		x = uint64(binary.LittleEndian.Uint32(a[:]))
	} else {
		a := k.Addr.As16()
		x = binary.LittleEndian.Uint64(a[8:]) ^ bits.RotateLeft64(binary.LittleEndian.Uint64(a[:8]), 32)
	}
	x *= 0x9e3779b97f4a7c15
	return x ^ x>>32
}

func hashNH(k NamespacedHostname) uint64 { return hashString(k.Hostname) }

func hashNSName(k nsName) uint64 { return hashString(k.name) }

// shardsFor returns the shard count for an index of n entries.
func shardsFor(n int) int {
	s := 1
	for s*shardTarget < n {
		s *= 2
	}
	return s
}

// shardMap is one index of a snapshot. It is immutable once the snapshot is
// built; only a shardEdit writes to it, while it builds a snapshot.
type shardMap[K comparable, V any] struct {
	shards []map[K]V // len is a power of two; a nil shard is empty
	n      int       // entries
}

// get returns the value under k, whose hash is h; the caller hashes with
// the index's own hash function, so that the call inlines.
func (m *shardMap[K, V]) get(h uint64, k K) V {
	return m.shards[h&uint64(len(m.shards)-1)][k]
}

// all calls f for every entry, in no particular order.
func (m *shardMap[K, V]) all(f func(K, V)) {
	for _, sh := range m.shards {
		for k, v := range sh {
			f(k, v)
		}
	}
}

// shardEdit writes to the shardMap of a snapshot being built. A fresh edit
// builds a new index and owns everything in it. Otherwise the map starts as
// a copy of a previous snapshot's: its shards are cloned on their first
// write, and slice values are copied on their first change (the edit tracks
// which ones it allocated and may therefore change in place).
type shardEdit[K comparable, V any] struct {
	m     *shardMap[K, V]
	hash  func(K) uint64
	fresh bool
	hint  int      // initial capacity of a fresh shard
	owned []uint64 // bitset of shards cloned by this edit
	mine  map[K]struct{}
}

// newShardEdit returns an edit of m: with fresh, m becomes an empty index
// sized for n entries; otherwise m must hold a copy of a previous
// snapshot's index, whose shards stay shared until written.
func newShardEdit[K comparable, V any](m *shardMap[K, V], hash func(K) uint64, fresh bool, n int) *shardEdit[K, V] {
	e := &shardEdit[K, V]{m: m, hash: hash, fresh: fresh}
	if fresh {
		s := shardsFor(n)
		m.shards, m.n = make([]map[K]V, s), 0
		e.hint = n / s
		return e
	}
	m.shards = slices.Clone(m.shards)
	e.owned = make([]uint64, (len(m.shards)+63)/64)
	e.mine = map[K]struct{}{}
	return e
}

func (e *shardEdit[K, V]) index(k K) uint64 { return e.hash(k) & uint64(len(e.m.shards)-1) }

func (e *shardEdit[K, V]) get(k K) V { return e.m.shards[e.index(k)][k] }

// writable returns k's shard, cloned first if it is still shared.
func (e *shardEdit[K, V]) writable(k K) map[K]V {
	i := e.index(k)
	sh := e.m.shards[i]
	switch {
	case e.fresh:
		if sh == nil {
			sh = make(map[K]V, e.hint)
			e.m.shards[i] = sh
		}
	case e.owned[i/64]&(1<<(i%64)) == 0:
		sh = make(map[K]V, len(sh)+1)
		maps.Copy(sh, e.m.shards[i])
		e.m.shards[i] = sh
		e.owned[i/64] |= 1 << (i % 64)
	}
	return sh
}

func (e *shardEdit[K, V]) set(k K, v V) {
	sh := e.writable(k)
	if _, ok := sh[k]; !ok {
		e.m.n++
	}
	sh[k] = v
}

func (e *shardEdit[K, V]) del(k K) {
	if _, ok := e.m.shards[e.index(k)][k]; !ok {
		return
	}
	delete(e.writable(k), k)
	e.m.n--
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
	if e.m.n <= shardGrowth*shardTarget*len(e.m.shards) {
		return
	}
	old := e.m.shards
	s := shardsFor(e.m.n)
	e.m.shards = make([]map[K]V, s)
	for _, sh := range old {
		for k, v := range sh {
			i := e.index(k)
			if e.m.shards[i] == nil {
				e.m.shards[i] = make(map[K]V, e.m.n/s)
			}
			e.m.shards[i][k] = v
		}
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
