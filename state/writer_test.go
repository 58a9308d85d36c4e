package state

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// writerWorkload is a workload as the converters make one: HBONE unless
// tcp, with one address and a port map for each service key.
func writerWorkload(uid, ip string, tcp bool, services ...string) *Workload {
	w := &Workload{UID: uid, Name: uid, Protocol: ProtocolHBONE, Capacity: 1,
		Addresses: []netip.Addr{netip.MustParseAddr(ip)}, Labels: &WorkloadLabels{Namespace: "ns"}}
	if tcp {
		w.Protocol = ProtocolTCP
	}
	m := map[string]map[uint16]uint16{}
	for _, k := range services {
		m[k] = map[uint16]uint16{80: 8080}
	}
	w.Services = ServicesOf(m)
	return w
}

// writerService is a service "name.ns.svc.cluster.local" with one VIP.
func writerService(name, vip string) *Service {
	return &Service{Name: name, Namespace: "ns", Hostname: name + ".ns.svc.cluster.local",
		VIPs: []NetworkAddress{{Addr: netip.MustParseAddr(vip)}}, Ports: map[uint16]uint16{80: 8080}}
}

// TestDeltaPublishMatchesFullBuild pushes random updates (workloads
// fighting over a few addresses, services coming and going) and checks that
// each snapshot published through the delta path equals a full build of
// what the Writer holds.
func TestDeltaPublishMatchesFullBuild(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	store := NewStore(nil)
	x, err := NewWriter(store, nil, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	ips := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}
	for step := range 300 {
		var (
			workloads []*Workload
			services  []*Service
			removedW  []string
			removedS  []string
		)
		for range 1 + r.IntN(3) {
			switch r.IntN(5) {
			case 0, 1:
				uid := fmt.Sprintf("c/apps/Deployment/ns/w%d", r.IntN(6))
				if r.IntN(2) == 0 {
					uid = fmt.Sprintf("Kubernetes//Pod/ns/p%d", r.IntN(6))
				}
				ip := ips[r.IntN(len(ips))]
				tcp := r.IntN(3) == 0
				workloads = append(workloads, writerWorkload(uid, ip, tcp, fmt.Sprintf("ns/s%d.ns.svc.cluster.local", r.IntN(3))))
			case 2:
				name := fmt.Sprintf("s%d", r.IntN(3))
				services = append(services, writerService(name, fmt.Sprintf("10.96.0.%d", 1+r.IntN(3))))
			case 3:
				if r.IntN(2) == 0 {
					removedW = append(removedW, fmt.Sprintf("Kubernetes//Pod/ns/p%d", r.IntN(6)))
				} else {
					removedW = append(removedW, fmt.Sprintf("c/apps/Deployment/ns/w%d", r.IntN(6)))
				}
			default:
				removedS = append(removedS, fmt.Sprintf("ns/s%d.ns.svc.cluster.local", r.IntN(3)))
			}
		}
		err := x.Update(func(tx *Tx) {
			for _, w := range workloads {
				tx.PutWorkload(w)
			}
			for _, s := range services {
				tx.PutService(s)
			}
			for _, uid := range removedW {
				tx.RemoveWorkload(uid)
			}
			for _, key := range removedS {
				tx.RemoveService(key)
			}
		})
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		x.mu.Lock()
		full, err := x.buildFullLocked()
		x.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		got := store.Load()
		if !reflect.DeepEqual(got.Workloads(), full.Workloads()) || !reflect.DeepEqual(got.Services(), full.Services()) {
			t.Fatalf("step %d: published snapshot differs from a full build", step)
		}
		for _, ip := range ips {
			g, w := got.WorkloadByAddr("", netip.MustParseAddr(ip)), full.WorkloadByAddr("", netip.MustParseAddr(ip))
			if (g == nil) != (w == nil) || g != nil && g.UID != w.UID {
				t.Fatalf("step %d: %s resolves to %v, want %v", step, ip, g, w)
			}
		}
		for _, svc := range full.Services() {
			var g, w []string
			for _, e := range got.Endpoints(got.ServiceByKey(svc.Key())) {
				g = append(g, e.Workload.UID)
			}
			for _, e := range full.Endpoints(svc) {
				w = append(w, e.Workload.UID)
			}
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("step %d: endpoints of %s: %v, want %v", step, svc.Key(), g, w)
			}
		}
	}
}

// TestWriterRanksSharedAddresses: two workloads claiming one address are
// both kept; the address resolves to the ranked first (pod, then HBONE,
// then the latest), and back to the other when the winner goes.
func TestWriterRanksSharedAddresses(t *testing.T) {
	ip := netip.MustParseAddr("10.0.0.7")
	for _, tc := range []struct {
		first, second *Workload
		winner        string
	}{
		{writerWorkload("Kubernetes//Pod/ns/p", "10.0.0.7", true), writerWorkload("c/networking.istio.io/WorkloadEntry/ns/we", "10.0.0.7", false), "Kubernetes//Pod/ns/p"},
		{writerWorkload("a", "10.0.0.7", false), writerWorkload("b", "10.0.0.7", true), "a"},
		{writerWorkload("a", "10.0.0.7", false), writerWorkload("b", "10.0.0.7", false), "b"},
		{writerWorkload("a", "10.0.0.7", false), writerWorkload("b", "::ffff:10.0.0.7", false), "b"},
	} {
		store := NewStore(nil)
		x, err := NewWriter(store, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		loser := tc.first.UID
		if loser == tc.winner {
			loser = tc.second.UID
		}
		svc := &Service{Name: "se", Namespace: "ns", Hostname: "se.example.com", Ports: map[uint16]uint16{80: 8080}}
		if err := x.Update(func(tx *Tx) { tx.PutService(svc) }); err != nil {
			t.Fatal(err)
		}
		for _, w := range []*Workload{tc.first, tc.second} {
			if w.UID == loser {
				w.Services = ServicesOf(map[string]map[uint16]uint16{svc.Key(): nil})
			}
			if err := x.Update(func(tx *Tx) { tx.PutWorkload(w) }); err != nil {
				t.Fatal(err)
			}
		}
		s := store.Load()
		if w := s.WorkloadByAddr("", ip); w == nil || w.UID != tc.winner {
			t.Fatalf("%s vs %s: address resolves to %v", tc.first.UID, tc.second.UID, w)
		}
		// The loser keeps the address as its own (ztunnel's workload_ips):
		// as the endpoint of a service it is dialled there, as a
		// ServiceEntry's inline endpoint on a pod's address is.
		got, port, err := s.PickEndpoint(nil, s.ServiceByKey(svc.Key()), 80, nil)
		if err != nil || got.UID != loser || port != 8080 {
			t.Fatalf("%s vs %s: the service's endpoint is %v:%d (%v), want %s:8080", tc.first.UID, tc.second.UID, got, port, err, loser)
		}
		if a, ok := SelectAddress(got, ip, IPFamiliesAutomatic); !ok || a.Unmap() != ip {
			t.Fatalf("%s vs %s: the loser is dialled on %v (%v), want %v", tc.first.UID, tc.second.UID, a, ok, ip)
		}
		if err := x.Update(func(tx *Tx) { tx.RemoveWorkload(tc.winner) }); err != nil {
			t.Fatal(err)
		}
		if w := store.Load().WorkloadByAddr("", ip); w == nil || w.UID != loser {
			t.Errorf("after removing %s the address resolves to %v, want %s", tc.winner, w, loser)
		}
	}
}

// TestWriterPolicyKeys: a policy key has one owning resource name, and a
// base is held under its keys, replaced and removed like any update.
func TestWriterPolicyKeys(t *testing.T) {
	p := func(name string) *Policy { return &Policy{Name: name, Namespace: "ns", Scope: ScopeNamespace} }
	store := NewStore(nil)
	x, err := NewWriter(store, &Base{Policies: []*Policy{p("a")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var owner string
	var ok bool
	err = x.Update(func(tx *Tx) {
		owner, ok = tx.PutPolicy("other-name-for-a", p("a"))
		tx.PutPolicy("ns/b", p("b"))
		tx.RemovePolicy("ns/a")
	})
	if err != nil || ok || owner != "ns/a" {
		t.Fatalf("PutPolicy of a held key: owner %q, ok %v, err %v", owner, ok, err)
	}
	if ps := store.Load().Policies(); len(ps) != 1 || ps[0].Name != "b" {
		t.Errorf("policies %v, want only b", ps)
	}
	if w, s, n := x.Counts(); w != 0 || s != 0 || n != 1 {
		t.Errorf("Counts = %d, %d, %d", w, s, n)
	}
	if _, err := NewWriter(NewStore(nil), &Base{Policies: []*Policy{p("a"), p("a")}}, nil); err == nil {
		t.Error("a base with a duplicate policy was accepted")
	}
}

// TestWriterDirtySetsShrink: a dirty set that held a large push is replaced
// once the push is published, so that later deltas do not walk its table
// (Go's clear keeps a map's table; ranging over the map visits all of it).
// One that held a few keys is kept and emptied.
func TestWriterDirtySetsShrink(t *testing.T) {
	w, err := NewWriter(NewStore(nil), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	mapID := func() uintptr { return reflect.ValueOf(w.pending).Pointer() }
	for _, tc := range []struct {
		name      string
		workloads int
		replaced  bool
	}{
		{"large push", 1000, true},
		{"one workload", 1, false},
		{"dirtyKeep workloads", dirtyKeep, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := mapID()
			if err := w.Update(func(tx *Tx) {
				for i := range tc.workloads {
					tx.PutWorkload(writerWorkload(fmt.Sprintf("%s-%d", tc.name, i), fmt.Sprintf("10.%d.%d.%d", len(tc.name), i>>8, i&255), false))
				}
			}); err != nil {
				t.Fatal(err)
			}
			if len(w.pending) != 0 {
				t.Fatalf("%d dirty workloads left after the update", len(w.pending))
			}
			if replaced := mapID() != before; replaced != tc.replaced {
				t.Errorf("dirty set replaced = %v, want %v", replaced, tc.replaced)
			}
		})
	}
}

// TestWriterMatchesModel puts and removes workloads sharing a few
// addresses, a few updates at a time, and checks every published snapshot
// against a model of the ranking: each address resolves to the workload
// ranked first among those holding it (a pod, then HBONE, then the one put
// most recently), every other holder is published without it, and Counts
// counts what is held.
func TestWriterMatchesModel(t *testing.T) {
	type held struct {
		w   *Workload
		put int
	}
	r := rand.New(rand.NewPCG(3, 4))
	store := NewStore(nil)
	x, err := NewWriter(store, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ips := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}
	model := map[string]held{}
	puts := 0
	for step := range 400 {
		if err := x.Update(func(tx *Tx) {
			for range 1 + r.IntN(3) {
				uid := fmt.Sprintf("c/apps/Deployment/ns/w%d", r.IntN(5))
				if r.IntN(2) == 0 {
					uid = fmt.Sprintf("Kubernetes//Pod/ns/p%d", r.IntN(5))
				}
				if r.IntN(4) == 0 {
					tx.RemoveWorkload(uid)
					delete(model, uid)
					continue
				}
				w := writerWorkload(uid, ips[r.IntN(len(ips))], r.IntN(3) == 0)
				if r.IntN(4) == 0 {
					w.Addresses = append(w.Addresses, netip.MustParseAddr(ips[r.IntN(len(ips))]))
				}
				puts++
				tx.PutWorkload(w)
				model[uid] = held{w, puts}
			}
		}); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		s := store.Load()
		if n, _, _ := x.Counts(); n != len(model) {
			t.Fatalf("step %d: %d workloads counted, %d held", step, n, len(model))
		}
		rank := func(h held) [3]int {
			var pod, hbone int
			if strings.Contains(h.w.UID, "//Pod/") {
				pod = 1
			}
			if h.w.Protocol == ProtocolHBONE {
				hbone = 1
			}
			return [3]int{pod, hbone, h.put}
		}
		winners := map[netip.Addr]string{}
		for _, ip := range ips {
			a := netip.MustParseAddr(ip)
			var best *held
			for _, h := range model {
				if !slices.Contains(h.w.Addresses, a) {
					continue
				}
				if best != nil {
					if rh, rb := rank(h), rank(*best); slices.Compare(rh[:], rb[:]) <= 0 {
						continue
					}
				}
				best = &h
			}
			got := s.WorkloadByAddr("", a)
			switch {
			case best == nil && got != nil:
				t.Fatalf("step %d: %s resolves to %s, held by none", step, ip, got.UID)
			case best != nil && (got == nil || got.UID != best.w.UID):
				t.Fatalf("step %d: %s resolves to %v, want %s", step, ip, got, best.w.UID)
			case best != nil:
				winners[a] = best.w.UID
			}
		}
		for uid, h := range model {
			var want []netip.Addr
			for _, a := range h.w.Addresses {
				if winners[a] == uid && !slices.Contains(want, a) {
					want = append(want, a)
				}
			}
			got := s.WorkloadByUID(uid)
			if got == nil {
				t.Fatalf("step %d: %s not published", step, uid)
			}
			// It keeps every address (a service endpoint is dialled on
			// them, as ztunnel's workload_ips), and those it loses are
			// marked: it owns the rest.
			if !slices.Equal(got.Addresses, h.w.Addresses) {
				t.Fatalf("step %d: %s published with %v, want all of %v", step, uid, got.Addresses, h.w.Addresses)
			}
			var g []netip.Addr
			for i, a := range got.Addresses {
				if !got.losesAddr(i) && !slices.Contains(g, a) {
					g = append(g, a)
				}
			}
			slices.SortFunc(g, netip.Addr.Compare)
			slices.SortFunc(want, netip.Addr.Compare)
			if !slices.Equal(g, want) {
				t.Fatalf("step %d: %s owns %v of %v, want %v", step, uid, g, got.Addresses, want)
			}
		}
	}
}

// TestWriterHoldsNoWorkloadTable: what a Writer retains beyond its
// snapshot stays a few bytes per workload: it finds the workloads and
// addresses it holds in the snapshot's indexes rather than in tables of
// its own (issue 36: those took ~130 B per workload).
func TestWriterHoldsNoWorkloadTable(t *testing.T) {
	const n = 20000
	mk := func() []*Workload {
		ws := make([]*Workload, n)
		for i := range ws {
			ws[i] = writerWorkload(fmt.Sprintf("Kubernetes//Pod/ns/p%d", i), netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String(), false)
		}
		return ws
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	ws := mk()
	base := heap()
	snap, err := NewSnapshot(ws, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	bare := heap() - base
	runtime.KeepAlive(snap)

	ws = mk()
	base = heap()
	x, err := NewWriter(NewStore(nil), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Update(func(tx *Tx) {
		for _, w := range ws {
			tx.PutWorkload(w)
		}
	}); err != nil {
		t.Fatal(err)
	}
	withWriter := heap() - base
	runtime.KeepAlive(x)
	if extra := (int64(withWriter) - int64(bare)) / n; extra > 32 {
		t.Errorf("the Writer retains %d B per workload beyond its snapshot's %d", extra, bare/n)
	}
}

// TestWriterHoldsNoServiceTable: nor does it keep a table of services: it
// finds them in the snapshot's index (issue 36: a map by key cost ~80 B
// per service).
func TestWriterHoldsNoServiceTable(t *testing.T) {
	const n = 20000
	mk := func() []*Service {
		ss := make([]*Service, n)
		for i := range ss {
			ns := "ns-" + strconv.Itoa(i%100)
			ss[i] = &Service{Name: "svc-" + strconv.Itoa(i), Namespace: ns, Hostname: "svc-" + strconv.Itoa(i) + "." + ns + ".svc.cluster.local"}
		}
		return ss
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	ss := mk()
	base := heap()
	snap, err := NewSnapshot(nil, ss, nil)
	if err != nil {
		t.Fatal(err)
	}
	bare := heap() - base
	runtime.KeepAlive(snap)

	ss = mk()
	base = heap()
	x, err := NewWriter(NewStore(nil), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Update(func(tx *Tx) {
		for _, s := range ss {
			tx.PutService(s)
		}
	}); err != nil {
		t.Fatal(err)
	}
	withWriter := heap() - base
	runtime.KeepAlive(x)
	if extra := (int64(withWriter) - int64(bare)) / n; extra > 16 {
		t.Errorf("the Writer retains %d B per service beyond its snapshot's %d", extra, bare/n)
	}
	if _, got, _ := x.Counts(); got != n {
		t.Errorf("Counts: %d services, want %d", got, n)
	}
}
