package state

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestApplyCases(t *testing.T) {
	web := svc("ns", "web.ns.svc", "/10.96.0.1")
	w1 := wl("w1", "ns", "p1", "10.0.0.1")
	w1.Services = ServicesOf(map[string]map[uint16]uint16{"ns/web.ns.svc": {80: 8080}})
	w2 := wl("w2", "ns", "p2", "10.0.0.2")
	w2.Services = ServicesOf(map[string]map[uint16]uint16{"ns/web.ns.svc": {80: 8080}})
	sick := wl("w3", "ns", "p3", "10.0.0.3")
	sick.Status = Unhealthy
	sick.Services = ServicesOf(map[string]map[uint16]uint16{"ns/web.ns.svc": {80: 8080}})
	moved := *w1
	moved.Addresses = addrs("10.0.0.9")
	swap1, swap2 := *w1, *w2
	swap1.Addresses, swap2.Addresses = w2.Addresses, w1.Addresses
	newVIPs := svc("ns", "web.ns.svc", "/10.96.0.7", "/10.96.0.8")
	allowAll := svc("ns", "web.ns.svc", "/10.96.0.1")
	allowAll.EditExtra().LoadBalancer = &LoadBalancer{HealthPolicy: LBAllowAll}
	thief := wl("w9", "ns", "p9", "10.0.0.2")
	pol := &Policy{Name: "deny", Namespace: "ns", Scope: ScopeNamespace, Action: ActionDeny}

	uids := func(eps []Endpoint) string {
		var out []string
		for _, e := range eps {
			out = append(out, e.Workload.UID)
		}
		return strings.Join(out, ",")
	}
	base := func() ([]*Workload, []*Service, []*Policy) {
		return []*Workload{w1, w2, sick}, []*Service{web}, nil
	}
	for _, tc := range []struct {
		name    string
		delta   Delta
		wantErr string
		check   func(t *testing.T, before, after *Snapshot)
	}{
		{name: "remove an endpoint's workload", delta: Delta{RemovedWorkloads: []string{"w1"}},
			check: func(t *testing.T, _, s *Snapshot) {
				if got := uids(s.Endpoints(web)); got != "w2" || s.WorkloadByAddr("", w1.Addresses[0]) != nil {
					t.Errorf("endpoints %q", got)
				}
			}},
		{name: "change a workload's IP", delta: Delta{Workloads: []*Workload{&moved}},
			check: func(t *testing.T, _, s *Snapshot) {
				if s.WorkloadByAddr("", w1.Addresses[0]) != nil || s.WorkloadByAddr("", moved.Addresses[0]) != &moved {
					t.Error("address index not moved")
				}
				if got := s.Endpoints(web); len(got) != 2 || got[0].Workload != &moved {
					t.Errorf("endpoints %q", uids(got))
				}
			}},
		{name: "two workloads swap IPs", delta: Delta{Workloads: []*Workload{&swap2, &swap1}},
			check: func(t *testing.T, _, s *Snapshot) {
				if s.WorkloadByAddr("", w1.Addresses[0]) != &swap2 || s.WorkloadByAddr("", w2.Addresses[0]) != &swap1 {
					t.Error("addresses not swapped")
				}
			}},
		{name: "replace a service's VIPs", delta: Delta{Services: []*Service{newVIPs}},
			check: func(t *testing.T, _, s *Snapshot) {
				if s.ServiceByVIP("", web.VIPs[0].Addr) != nil || s.ServiceByVIP("", newVIPs.VIPs[1].Addr) != newVIPs {
					t.Error("VIP index not replaced")
				}
				if got := uids(s.Endpoints(newVIPs)); got != "w1,w2" {
					t.Errorf("endpoints %q", got)
				}
			}},
		{name: "health policy AllowAll takes the unhealthy workload", delta: Delta{Services: []*Service{allowAll}},
			check: func(t *testing.T, _, s *Snapshot) {
				if got := uids(s.Endpoints(allowAll)); got != "w1,w2,w3" {
					t.Errorf("endpoints %q", got)
				}
			}},
		{name: "service removed then back", delta: Delta{RemovedServices: []string{"ns/web.ns.svc"}, Services: []*Service{web}},
			check: func(t *testing.T, _, s *Snapshot) {
				if s.ServiceByKey("ns/web.ns.svc") != web || uids(s.Endpoints(web)) != "w1,w2" {
					t.Error("service lost")
				}
			}},
		{name: "service removed", delta: Delta{RemovedServices: []string{"ns/web.ns.svc"}},
			check: func(t *testing.T, _, s *Snapshot) {
				if s.ServiceByVIP("", web.VIPs[0].Addr) != nil || len(s.Endpoints(web)) != 0 {
					t.Error("service still indexed")
				}
			}},
		{name: "duplicate IP rejected", delta: Delta{Workloads: []*Workload{thief}},
			wantErr: `address /10.0.0.2 is used by two workloads: "w2" and "w9"`},
		{name: "duplicate uid in the delta", delta: Delta{Workloads: []*Workload{w1, w1}}, wantErr: `workload "w1": duplicate uid`},
		{name: "invalid workload", delta: Delta{Workloads: []*Workload{{UID: "bad", Protocol: 7}}}, wantErr: "invalid protocol 7"},
		{name: "policy change gets a new generation", delta: Delta{Policies: []*Policy{pol}},
			check: func(t *testing.T, before, s *Snapshot) {
				if s.PolicyGeneration() == before.PolicyGeneration() || len(s.Policies()) != 1 {
					t.Error("policy not compiled")
				}
			}},
		{name: "workload change keeps the generation", delta: Delta{RemovedWorkloads: []string{"w2"}},
			check: func(t *testing.T, before, s *Snapshot) {
				if s.PolicyGeneration() != before.PolicyGeneration() {
					t.Error("generation changed")
				}
			}},
		{name: "empty delta", delta: Delta{},
			check: func(t *testing.T, before, s *Snapshot) {
				if s != before {
					t.Error("an empty delta built a new snapshot")
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, ss, ps := base()
			before := mustSnapshot(t, ws, ss, ps)
			got, err := before.Apply(tc.delta)
			ref, _ := NewSnapshot(ws, ss, ps)
			checkSame(t, before, ref) // untouched either way
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, before, got)
			m := newDeltaModel()
			for _, w := range ws {
				m.w[w.UID] = w
			}
			for _, v := range ss {
				m.s[v.Key()] = v
			}
			next, _ := m.apply(tc.delta)
			want, err := next.build()
			if err != nil {
				t.Fatal(err)
			}
			checkSame(t, got, want)
		})
	}
}

// BenchmarkApplyDelta: one delta applied to a snapshot of 100k workloads
// (10k services), against a full NewSnapshot of the same sets; speedup-x is
// the ratio of the two. cpu-ns/op is the process's CPU time per delta (the
// garbage collector's share included), which waiting for a core on a busy
// machine does not inflate.
func BenchmarkApplyDelta(b *testing.B) {
	ws, ss := meshInput(100_000)
	base := mustSnapshot(b, ws, ss, nil)
	start := time.Now()
	const rebuilds = 3
	for range rebuilds {
		mustSnapshot(b, ws, ss, nil)
	}
	full := float64(time.Since(start).Nanoseconds()) / rebuilds

	w := ws[4242]
	versions := [2]*Workload{}
	for i := range versions {
		v := *w
		v.EditLabels().CanonicalRevision = "v" + itoa(i)
		versions[i] = &v
	}
	moved := *ss[77]
	moved.VIPs = []NetworkAddress{{"", addrs("172.31.0.1")[0]}}
	burst, orig := make([]*Workload, 100), make([]*Workload, 100)
	for i := range burst {
		v := *ws[i*997]
		v.EditLabels().CanonicalRevision = "v2"
		burst[i], orig[i] = &v, ws[i*997]
	}
	for _, bc := range []struct {
		name   string
		deltas [2]Delta
	}{
		{"one-workload", [2]Delta{{Workloads: versions[:1]}, {Workloads: versions[1:]}}},
		{"one-service", [2]Delta{{Services: []*Service{&moved}}, {Services: []*Service{ss[77]}}}},
		{"burst-100-workloads", [2]Delta{{Workloads: burst}, {Workloads: orig}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := base
			b.ReportAllocs()
			n := 0
			start := cpuTime()
			for b.Loop() {
				next, err := s.Apply(bc.deltas[n%2])
				if err != nil {
					b.Fatal(err)
				}
				s = next
				n++
			}
			b.ReportMetric(float64(cpuTime()-start)/float64(n), "cpu-ns/op")
			per := float64(b.Elapsed().Nanoseconds()) / float64(n)
			b.ReportMetric(full/1e6, "rebuild-ms")
			b.ReportMetric(full/per, "speedup-x")
		})
	}
}
