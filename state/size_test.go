package state

import (
	"testing"
	"unsafe"
)

// TestWorkloadSizeClass keeps the per-workload record within its malloc
// size class (issue 36: 100,000 of them in a large mesh). 320 bytes is a
// size class; the next one is 352.
func TestWorkloadSizeClass(t *testing.T) {
	if size, budget := unsafe.Sizeof(Workload{}), uintptr(320); size > budget {
		t.Errorf("Workload is %d bytes, more than its budget of %d (a malloc size class)", size, budget)
	}
}

// TestInfoIndexSlot keeps the namespace/name index's slot at its hash, a
// hash key and the list (issue 36: a key of two strings made it 64 bytes).
func TestInfoIndexSlot(t *testing.T) {
	if size := unsafe.Sizeof(slot[infoKey, []*Workload]{}); size > 40 {
		t.Errorf("byInfo slot is %d bytes, want at most 40", size)
	}
}

// TestFindWorkloadSharedKey: workloads whose namespace and name hash alike
// share a list of the index, and FindWorkload still returns only the one
// asked for.
func TestFindWorkloadSharedKey(t *testing.T) {
	a := &Workload{UID: "u-2", Name: "a", Namespace: "ns1", Capacity: 1}
	b := &Workload{UID: "u-1", Name: "b", Namespace: "ns2", Capacity: 1}
	s := mustSnapshot(t, []*Workload{a, b}, nil, nil)
	// Put b under a's key too, as a collision of the two hashes would.
	e := newShardEdit(&s.byInfo, hashInfo, false, 0)
	insertSorted(e, infoKeyOf("ns1", "a"), b, cmpWorkloads)
	for _, tc := range []struct {
		info WorkloadInfo
		want *Workload
	}{
		{WorkloadInfo{Namespace: "ns1", Name: "a"}, a},
		{WorkloadInfo{Namespace: "ns2", Name: "b"}, b},
		{WorkloadInfo{Namespace: "ns1", Name: "b"}, nil},
	} {
		if got := s.FindWorkload(tc.info); got != tc.want {
			t.Errorf("FindWorkload(%+v) = %v, want %v", tc.info, got, tc.want)
		}
	}
}
