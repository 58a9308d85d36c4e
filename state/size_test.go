package state

import (
	"testing"
	"unsafe"
)

// TestWorkloadSizeClass keeps the per-workload record within its malloc
// size class (issue 36: 100,000 of them in a large mesh). 96 bytes is a
// size class; the next one is 112.
func TestWorkloadSizeClass(t *testing.T) {
	if size, budget := unsafe.Sizeof(Workload{}), uintptr(96); size > budget {
		t.Errorf("Workload is %d bytes, more than its budget of %d (a malloc size class)", size, budget)
	}
}

// TestServiceSizeClass keeps the service record within its malloc size
// class (issue 36: 20,000 of them in a large mesh). 112 bytes is a size
// class; with its rare fields inline it was 176.
func TestServiceSizeClass(t *testing.T) {
	if size, budget := unsafe.Sizeof(Service{}), uintptr(112); size > budget {
		t.Errorf("Service is %d bytes, more than its budget of %d (a malloc size class)", size, budget)
	}
}

// TestInfoIndexSlot keeps the namespace/name index's slot at its hash and
// the workload (issue 36: a key of two strings made it 64 bytes, a list 40).
func TestInfoIndexSlot(t *testing.T) {
	if size := unsafe.Sizeof(slot[hashed, *Workload]{}); size > 16 {
		t.Errorf("byInfo slot is %d bytes, want at most 16", size)
	}
}

// TestFindWorkloadSharedKey: workloads whose namespace and name hash alike
// share a list of the index, and FindWorkload still returns only the one
// asked for; a snapshot built of such workloads and one derived from it
// by removing one of them index alike.
func TestFindWorkloadSharedKey(t *testing.T) {
	a := &Workload{UID: "u-2", Name: "a", Capacity: 1, Labels: &WorkloadLabels{Namespace: "ns1"}}
	b := &Workload{UID: "u-1", Name: "b", Capacity: 1, Labels: &WorkloadLabels{Namespace: "ns2"}}
	c := &Workload{UID: "u-3", Name: "a", Capacity: 1, Labels: &WorkloadLabels{Namespace: "ns1"}, Place: &Placement{Node: "n2"}}
	s := mustSnapshot(t, []*Workload{a, b, c}, nil, nil)
	// Put b under a's key too, as a collision of the two hashes would.
	k := infoKeyOf("ns1", "a")
	e := newShardEdit(&s.byInfoMulti, hashInfo, false, 0)
	insertSorted(e, k, b, cmpWorkloads)
	if got := s.byInfoMulti.get(hashInfo(k), k); len(got) != 3 {
		t.Fatalf("byInfoMulti holds %v under a's key, want a, b and c", got)
	}
	for _, tc := range []struct {
		info WorkloadInfo
		want *Workload
	}{
		{WorkloadInfo{Namespace: "ns1", Name: "a"}, a},
		{WorkloadInfo{Namespace: "ns1", Name: "a", Node: "n2"}, c},
		{WorkloadInfo{Namespace: "ns2", Name: "b"}, b},
		{WorkloadInfo{Namespace: "ns1", Name: "b"}, nil},
		{WorkloadInfo{Namespace: "ns2", Name: "a"}, nil},
	} {
		if got := s.FindWorkload(tc.info); got != tc.want {
			t.Errorf("FindWorkload(%+v) = %v, want %v", tc.info, got, tc.want)
		}
	}

	// a and c share a name: a list until one of them leaves.
	s = mustSnapshot(t, []*Workload{a, b, c}, nil, nil)
	if s.byInfo.n != 1 || s.byInfoMulti.n != 1 {
		t.Fatalf("byInfo holds %d, byInfoMulti %d; want b alone, and a list of a and c", s.byInfo.n, s.byInfoMulti.n)
	}
	d, err := s.Apply(Delta{RemovedWorkloads: []string{"u-2"}})
	if err != nil {
		t.Fatal(err)
	}
	checkSame(t, d, mustSnapshot(t, []*Workload{b, c}, nil, nil))
	if d.byInfoMulti.n != 0 || d.FindWorkload(WorkloadInfo{Namespace: "ns1", Name: "a"}) != c {
		t.Errorf("after a left: byInfoMulti holds %d, FindWorkload(ns1/a) = %v; want none and c", d.byInfoMulti.n, d.FindWorkload(WorkloadInfo{Namespace: "ns1", Name: "a"}))
	}
}

// editExtra sets w.Extra to a copy of it (or of an empty one) changed by
// f: tests change workloads that may share an Extra with another.
func (w *Workload) editExtra(f func(*WorkloadExtra)) {
	var x WorkloadExtra
	if w.Extra != nil {
		x = *w.Extra
	}
	f(&x)
	w.SetExtra(x)
}

// TestMemberListsTrimmed: a snapshot built from scratch keeps each
// service's member list at its length (issue 36: grown by appending, the
// lists of a mesh with 10 replicas per service had room for 16).
func TestMemberListsTrimmed(t *testing.T) {
	ws, ss := meshInput(1000)
	s := mustSnapshot(t, ws, ss, nil)
	n := 0
	s.svcEps.all(func(k NamespacedHostname, v svcMembers) {
		list := v.members
		n += len(list)
		if cap(list) != len(list) {
			t.Errorf("members of %v: %d with room for %d", k, len(list), cap(list))
		}
	})
	if n != len(ws) {
		t.Errorf("%d members, want %d", n, len(ws))
	}
}

// TestEndpointsKeyedByServiceStrings: a service's entry in svcEps is keyed
// by the service's own strings, which Endpoints passes, so that the key
// compares by pointer: keyed by the strings cut from a workload's service
// key, each lookup compared the bytes (+36% CPU per VIP resolution at
// 100k workloads). Built from scratch and after a delta alike.
func TestEndpointsKeyedByServiceStrings(t *testing.T) {
	ws, ss := meshInput(100)
	for i, w := range ws { // keys of their own, as decoded ones are
		k := string([]byte(ss[i%len(ss)].Key()))
		w.Services = ServicesOf(map[string]map[uint16]uint16{k: {80: 8080}})
	}
	s := mustSnapshot(t, ws, ss, nil)
	extra := &Workload{UID: "zz", Name: "zz", Capacity: 1,
		Services: ServicesOf(map[string]map[uint16]uint16{string([]byte(ss[3].Key())): {80: 8080}}), Labels: &WorkloadLabels{Namespace: ss[3].Namespace}}
	d, err := s.Apply(Delta{Workloads: []*Workload{extra}})
	if err != nil {
		t.Fatal(err)
	}
	for _, snap := range []*Snapshot{s, d} {
		n := 0
		snap.svcEps.all(func(k NamespacedHostname, _ svcMembers) {
			svc := snap.ServiceByKey(k.String())
			if unsafe.StringData(k.Hostname) != unsafe.StringData(svc.Hostname) || unsafe.StringData(k.Namespace) != unsafe.StringData(svc.Namespace) {
				t.Errorf("svcEps key %v: not the service's strings", k)
			}
			n++
		})
		if n != len(ss) {
			t.Errorf("%d entries, want %d", n, len(ss))
		}
	}
}

// TestIndexSlots keeps the slots of the indexes that hold an entry per
// workload or per service without a key string or a list where the value
// carries its key or a key has one value (issue 36): the workloads by UID
// and the services by key (their string keys made the slots 32 and 48
// bytes), the services by VIP and by hostname (a list per key made them 40
// and 48).
func TestIndexSlots(t *testing.T) {
	var s Snapshot
	for _, c := range []struct {
		index     string
		size, max uintptr
	}{
		{"byUID", slotSize(&s.byUID), 16},
		{"svcByKey", slotSize(&s.svcByKey), 16},
		{"svcByVIP (IPv4)", slotSize(&s.svcByVIP.v4), 24},
		{"svcByHost", slotSize(&s.svcByHost), 32},
	} {
		if c.size > c.max {
			t.Errorf("%s slot is %d bytes, want at most %d", c.index, c.size, c.max)
		}
	}
}

// slotSize returns the size of a slot of m.
func slotSize[K comparable, V any](*shardMap[K, V]) uintptr { return unsafe.Sizeof(slot[K, V]{}) }
