package xdsclient

import (
	"cmp"
	"hash/maphash"
	"slices"
	"strings"
)

// versions records, for one type, the version of every resource the client
// holds (or has demanded and not yet received, with version ""), for
// initial_resource_versions on reconnect.
//
// It is dense rather than a map[string]string, which cost ~86 B per
// resource at 100,000 workloads (issue 36: the table is held for the life
// of the daemon): most names are held for long and change version in place,
// so they live in a slice, 32 B each, sorted by the hash of the name (then
// the name): sorting a push of 120,000 names by their bytes cost ~3 times
// more, as istiod's names share long prefixes. Names added since the
// last merge sit in a map and names of the slice removed since are marked in
// another; compact merges both into a new, exactly sized slice once they
// hold more than an eighth of it, so a push costs its own size and a
// one-resource change costs no allocation when its name is held.
//
// A name set again is stored as given, so that its bytes are those the
// handler kept (the xdsconv converter keeps a workload's uid as its
// resource name).
type versions struct {
	sorted  []nameVersion       // by nameOrder
	added   map[string]string   // names not in sorted
	removed map[string]struct{} // names of sorted no longer held
}

type nameVersion struct{ name, version string }

// compactMin is the number of pending changes (added or removed names)
// below which compact leaves them pending however small the slice.
const compactMin = 64

// nameSeed seeds the hash that orders a versions table.
var nameSeed = maphash.MakeSeed()

func hashName(name string) uint64 { return maphash.String(nameSeed, name) }

// nameOrder orders names by hash (ha, hb), then by their bytes.
func nameOrder(ha uint64, a string, hb uint64, b string) int {
	if c := cmp.Compare(ha, hb); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}

func (v *versions) find(name string) (int, bool) {
	h := hashName(name)
	return slices.BinarySearchFunc(v.sorted, name, func(e nameVersion, n string) int {
		return nameOrder(hashName(e.name), e.name, h, n)
	})
}

// get returns the version held for name, and whether it is held.
func (v *versions) get(name string) (string, bool) {
	if ver, ok := v.added[name]; ok {
		return ver, true
	}
	i, ok := v.find(name)
	if !ok {
		return "", false
	}
	if _, gone := v.removed[name]; gone {
		return "", false
	}
	return v.sorted[i].version, true
}

// has reports whether name is held.
func (v *versions) has(name string) bool {
	_, ok := v.get(name)
	return ok
}

// set records version for name.
func (v *versions) set(name, version string) {
	if i, ok := v.find(name); ok {
		v.sorted[i] = nameVersion{name, version}
		delete(v.removed, name)
		return
	}
	if v.added == nil {
		v.added = map[string]string{}
	}
	v.added[name] = version
}

// remove forgets name.
func (v *versions) remove(name string) {
	if _, ok := v.added[name]; ok {
		delete(v.added, name)
		return
	}
	if _, ok := v.find(name); ok {
		if v.removed == nil {
			v.removed = map[string]struct{}{}
		}
		v.removed[name] = struct{}{}
	}
}

// len returns the number of names held.
func (v *versions) len() int { return len(v.sorted) - len(v.removed) + len(v.added) }

// all calls f for every name held and its version, in no particular order.
func (v *versions) all(f func(name, version string)) {
	for _, e := range v.sorted {
		if _, gone := v.removed[e.name]; !gone {
			f(e.name, e.version)
		}
	}
	for n, ver := range v.added {
		f(n, ver)
	}
}

// compact merges the pending changes into the sorted slice once they are
// more than an eighth of it (and at least compactMin).
func (v *versions) compact() {
	pending := len(v.added) + len(v.removed)
	if pending < compactMin || pending <= len(v.sorted)/8 {
		return
	}
	type hashed struct {
		h uint64
		e nameVersion
	}
	add := make([]hashed, 0, len(v.added))
	for n, ver := range v.added {
		add = append(add, hashed{hashName(n), nameVersion{n, ver}})
	}
	slices.SortFunc(add, func(a, b hashed) int { return nameOrder(a.h, a.e.name, b.h, b.e.name) })
	out := make([]nameVersion, 0, v.len())
	old := v.sorted
	var oh uint64 // hash of old[0]'s name
	if len(old) > 0 {
		oh = hashName(old[0].name)
	}
	for len(old) > 0 || len(add) > 0 {
		if len(add) > 0 && (len(old) == 0 || nameOrder(add[0].h, add[0].e.name, oh, old[0].name) < 0) {
			out = append(out, add[0].e)
			add = add[1:]
			continue
		}
		if _, gone := v.removed[old[0].name]; !gone {
			out = append(out, old[0])
		}
		if old = old[1:]; len(old) > 0 {
			oh = hashName(old[0].name)
		}
	}
	v.sorted, v.added, v.removed = out, nil, nil
}
