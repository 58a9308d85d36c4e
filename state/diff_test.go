package state

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// diffWorkload returns workload i: a fresh pointer on each call, with an
// address of its own.
func diffWorkload(i int) *Workload {
	return &Workload{
		UID: fmt.Sprintf("uid-%d", i), Name: fmt.Sprintf("w%d", i),
		Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})},
		Labels:    &WorkloadLabels{Namespace: "ns"},
	}
}

// TestDiffWorkloads checks DiffWorkloads against the difference of the two
// snapshots' workload sets, along random sequences of deltas through small
// shards (so that indexes re-split) and through Apply's rebuild path.
func TestDiffWorkloads(t *testing.T) {
	defer func(n, m int) { shardTarget, rebuildMin = n, m }(shardTarget, rebuildMin)
	for _, tc := range []struct {
		name               string
		target, rebuildMin int
	}{
		{"edit", 4, 1 << 30},
		{"rebuild", 4, 8},
		{"default", 64, 256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shardTarget, rebuildMin = tc.target, tc.rebuildMin
			rnd := rand.New(rand.NewPCG(1, 2))
			model := map[string]*Workload{}
			var prev *Snapshot
			cur := Empty()
			for step := range 200 {
				var d Delta
				seen := map[string]bool{}
				for range rnd.IntN(40) {
					i := rnd.IntN(600)
					uid := fmt.Sprintf("uid-%d", i)
					if seen[uid] {
						continue
					}
					seen[uid] = true
					if rnd.IntN(3) == 0 {
						d.RemovedWorkloads = append(d.RemovedWorkloads, uid)
					} else {
						d.Workloads = append(d.Workloads, diffWorkload(i))
					}
				}
				next, err := cur.Apply(d)
				if err != nil {
					t.Fatal(err)
				}
				want := map[string][2]*Workload{}
				nextModel := map[string]*Workload{}
				for k, v := range model {
					nextModel[k] = v
				}
				for _, uid := range d.RemovedWorkloads {
					delete(nextModel, uid)
				}
				for _, w := range d.Workloads {
					nextModel[w.UID] = w
				}
				for k, v := range nextModel {
					if model[k] != v {
						want[k] = [2]*Workload{model[k], v}
					}
				}
				for k, v := range model {
					if nextModel[k] == nil {
						want[k] = [2]*Workload{v, nil}
					}
				}
				got := map[string][2]*Workload{}
				next.DiffWorkloads(cur, func(old, w *Workload) {
					uid := ""
					if old != nil {
						uid = old.UID
					} else {
						uid = w.UID
					}
					if _, dup := got[uid]; dup {
						t.Fatalf("step %d: %s reported twice", step, uid)
					}
					got[uid] = [2]*Workload{old, w}
				})
				if len(got) != len(want) {
					t.Fatalf("step %d: %d changes reported, want %d", step, len(got), len(want))
				}
				for k, v := range want {
					if got[k] != v {
						t.Fatalf("step %d: %s reported as %v, want %v", step, k, got[k], v)
					}
				}
				next.DiffWorkloads(next, func(old, w *Workload) { t.Fatalf("a snapshot differs from itself in %v %v", old, w) })
				if prev != nil {
					n := 0
					cur.DiffWorkloads(nil, func(old, w *Workload) {
						if old != nil || w == nil {
							t.Fatal("a diff against nil reports a removal")
						}
						n++
					})
					if n != len(model) {
						t.Fatalf("a diff against nil reports %d workloads, want %d", n, len(model))
					}
				}
				prev, cur, model = cur, next, nextModel
			}
		})
	}
}

// TestDiffWorkloadsSharesShards checks what makes DiffWorkloads cheap: a
// one-workload Apply on 100,000 workloads leaves all but the shard it
// writes shared with the snapshot it derives from, so that the diff reads
// the entries of one shard (its other cost is one comparison per page).
func TestDiffWorkloadsSharesShards(t *testing.T) {
	ws := make([]*Workload, 100_000)
	for i := range ws {
		ws[i] = diffWorkload(i)
	}
	s, err := NewSnapshot(ws, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	next, err := s.Apply(Delta{Workloads: []*Workload{diffWorkload(7)}})
	if err != nil {
		t.Fatal(err)
	}
	if s.byUID.shift != next.byUID.shift {
		t.Fatal("a one-workload Apply re-split the index")
	}
	differ := 0
	for p := range next.byUID.pages {
		for i := range next.byUID.pages[p] {
			if !sameSlice(s.byUID.pages[p][i], next.byUID.pages[p][i]) {
				differ++
			}
		}
	}
	if differ != 1 {
		t.Fatalf("%d of %d shards differ, want 1", differ, next.byUID.numShards())
	}
	n := 0
	next.DiffWorkloads(s, func(old, w *Workload) { n++ })
	if n != 1 {
		t.Fatalf("diff reports %d workloads, want 1", n)
	}
}
