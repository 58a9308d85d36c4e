package app

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/state"
)

// scanIdentities is the warmer's former full scan, the reference its
// diffs are checked against: the identities of the HBONE (or native
// tunnel) workloads of node (and cluster, when both say) in snap.
func scanIdentities(snap *state.Snapshot, node, cluster string) map[identity.Identity]bool {
	ids := map[identity.Identity]bool{}
	snap.EachWorkload(func(w *state.Workload) {
		if w.Node() != node || (cluster != "" && w.ClusterID() != "" && w.ClusterID() != cluster) {
			return
		}
		if w.Protocol == state.ProtocolHBONE || w.NativeTunnel {
			ids[w.Identity()] = true
		}
	})
	return ids
}

// testWarmer returns a shared-mode warmer of node n1 in cluster c1 that
// hands nothing to a prefetcher (closed), so that its identity set is
// observed as it is.
func testWarmer() *certWarmer {
	return &certWarmer{
		node: "n1", cluster: "c1", closed: true,
		pods: map[identity.Identity]int{}, fromState: map[identity.Identity]bool{}, byID: map[identity.Identity]int{},
	}
}

// warmWorkload returns workload i with the traits r draws: node, cluster,
// protocol, native tunnel and service account from small pools, so that
// identities are shared by a few workloads and come and go with them.
func warmWorkload(i int, r *rand.Rand) *state.Workload {
	w := &state.Workload{
		UID: fmt.Sprintf("uid-%d", i), Name: fmt.Sprintf("w%d", i),
		Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})},
		Labels:    &state.WorkloadLabels{Namespace: []string{"a", "b"}[r.IntN(2)], ServiceAccount: fmt.Sprintf("sa%d", r.IntN(8))},
		Place:     &state.Placement{Node: []string{"n1", "n1", "n2"}[r.IntN(3)]},
	}
	if c := []string{"", "c1", "c2"}[r.IntN(3)]; c != "" {
		w.EditLabels().ClusterID = c
	}
	if r.IntN(3) > 0 {
		w.Protocol = state.ProtocolHBONE
	}
	w.NativeTunnel = r.IntN(5) == 0
	return w
}

// TestCertWarmerFollowsPushes: along random pushes (workloads added,
// changed in node, cluster, protocol or identity, and removed), the
// identities the warmer takes from the state are those a full scan of the
// snapshot finds, whether it takes every snapshot or skips some (as its
// debounce does), and after a snapshot built from scratch.
func TestCertWarmerFollowsPushes(t *testing.T) {
	for _, every := range []int{1, 3} {
		t.Run(fmt.Sprintf("every%d", every), func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 4))
			c := testWarmer()
			snap := state.Empty()
			c.snapshot(snap)
			for step := range 300 {
				var d state.Delta
				seen := map[int]bool{}
				for range r.IntN(8) {
					i := r.IntN(40)
					if seen[i] {
						continue
					}
					seen[i] = true
					if r.IntN(4) == 0 {
						d.RemovedWorkloads = append(d.RemovedWorkloads, fmt.Sprintf("uid-%d", i))
					} else {
						d.Workloads = append(d.Workloads, warmWorkload(i, r))
					}
				}
				next, err := snap.Apply(d)
				if err != nil {
					t.Fatal(err)
				}
				if step == 150 { // a snapshot that shares nothing with the last one
					if next, err = state.NewSnapshot(next.Workloads(), nil, nil); err != nil {
						t.Fatal(err)
					}
				}
				snap = next
				if step%every != 0 {
					continue
				}
				c.snapshot(snap)
				if want := scanIdentities(snap, "n1", "c1"); !maps.Equal(c.fromState, want) {
					t.Fatalf("step %d: warmer holds %v, a scan finds %v", step, c.fromState, want)
				}
			}
		})
	}
}

// meshSnapshot returns a snapshot of n workloads, 250 of them HBONE
// workloads of node n1, and the same snapshot with workload 7 changed.
func meshSnapshot(tb testing.TB, n int) (*state.Snapshot, *state.Snapshot) {
	ws := make([]*state.Workload, n)
	for i := range ws {
		ws[i] = &state.Workload{
			UID: fmt.Sprintf("uid-%d", i), Name: fmt.Sprintf("w%d", i),
			Protocol:  state.ProtocolHBONE,
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})},
			Labels:    &state.WorkloadLabels{Namespace: fmt.Sprintf("ns%d", i%1000)},
			Place:     &state.Placement{Node: fmt.Sprintf("n%d", i%400)},
		}
	}
	s, err := state.NewSnapshot(ws, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	w := *ws[7]
	w.EditLabels().ServiceAccount = "other"
	next, err := s.Apply(state.Delta{Workloads: []*state.Workload{&w}})
	if err != nil {
		tb.Fatal(err)
	}
	return s, next
}

// TestCertWarmerVisitsOnlyChanges: after a one-workload push onto 100,000
// workloads, the warmer visits that workload, not the mesh (issue 36).
func TestCertWarmerVisitsOnlyChanges(t *testing.T) {
	s, next := meshSnapshot(t, 100_000)
	c := testWarmer()
	c.cluster = ""
	c.snapshot(s)
	c.visited = 0
	c.snapshot(next)
	if c.visited != 1 {
		t.Fatalf("a one-workload push visited %d workloads, want 1", c.visited)
	}
	if want := scanIdentities(next, "n1", ""); !maps.Equal(c.fromState, want) {
		t.Fatalf("warmer holds %v, a scan finds %v", c.fromState, want)
	}
}

// BenchmarkCertWarmerPush: the warmer taking a one-workload push onto
// 100,000 workloads, by the former full scan and by the diff, in one run.
func BenchmarkCertWarmerPush(b *testing.B) {
	s, next := meshSnapshot(b, 100_000)
	b.Run("scan", func(b *testing.B) {
		for range b.N {
			scanIdentities(next, "n1", "")
		}
	})
	b.Run("diff", func(b *testing.B) {
		c := testWarmer()
		c.cluster = ""
		c.snapshot(s)
		snaps := [2]*state.Snapshot{next, s}
		b.ResetTimer()
		for i := range b.N {
			c.snapshot(snaps[i%2])
		}
	})
}
