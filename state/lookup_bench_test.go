package state

import (
	"net/netip"
	"strconv"
	"syscall"
	"testing"
)

// meshInput returns n workloads over n/10 services (10 endpoints each), in
// 100 namespaces, with distinct IPv4 addresses for up to 16M workloads.
func meshInput(n int) ([]*Workload, []*Service) {
	ss := make([]*Service, max(n/10, 1))
	for i := range ss {
		ns := "ns-" + strconv.Itoa(i%100)
		v := &Service{Name: "svc-" + strconv.Itoa(i), Namespace: ns, Hostname: "svc-" + strconv.Itoa(i) + "." + ns + ".svc.cluster.local",
			Ports: map[uint16]uint16{80: 8080}}
		v.VIPs = []NetworkAddress{{"", netip.AddrFrom4([4]byte{172, 16 + byte(i>>16), byte(i >> 8), byte(i)})}}
		ss[i] = v
	}
	ws := make([]*Workload, n)
	for i := range ws {
		v := ss[i%len(ss)]
		w := &Workload{UID: "Kubernetes//Pod/" + v.Namespace + "/pod-" + strconv.Itoa(i), Name: "pod-" + strconv.Itoa(i),
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}, Protocol: ProtocolHBONE, Capacity: 1, Labels: &WorkloadLabels{Namespace: v.Namespace}}
		w.Services = ServicesOf(map[string]map[uint16]uint16{v.Key(): {80: 8080}})
		ws[i] = w
	}
	return ws, ss
}

// lookupMesh is the 100k-workload mesh the lookup benchmarks read: the
// data path's lookups at the scale the incremental builder is for.
func lookupMesh(b *testing.B) (*Snapshot, []netip.Addr, []string, []netip.Addr) {
	b.Helper()
	ws, ss := meshInput(100_000)
	s := mustSnapshot(b, ws, ss, nil)
	ips := make([]netip.Addr, len(ws))
	uids := make([]string, len(ws))
	for i, w := range ws {
		ips[i], uids[i] = w.Addresses[0], w.UID
	}
	vips := make([]netip.Addr, len(ss))
	for i, v := range ss {
		vips[i] = v.VIPs[0].Addr
	}
	return s, ips, uids, vips
}

// BenchmarkLookup100k: the lookups a connection makes, each over many keys
// so that the figures include cache misses as in a real mesh. Besides
// ns/op it reports cpu-ns/op, the process's CPU time per lookup, which
// time spent waiting for a core on a busy machine does not inflate.
func BenchmarkLookup100k(b *testing.B) {
	s, ips, uids, vips := lookupMesh(b)
	b.Run("WorkloadByAddr", func(b *testing.B) {
		lookupLoop(b, func(i int) bool { return s.WorkloadByAddr("", ips[i%len(ips)]) != nil })
	})
	b.Run("WorkloadByUID", func(b *testing.B) {
		lookupLoop(b, func(i int) bool { return s.WorkloadByUID(uids[i%len(uids)]) != nil })
	})
	// A proxy finds the workload it serves by namespace and name, once per
	// connection.
	infos := make([]WorkloadInfo, len(uids))
	for i := range infos {
		w := s.WorkloadByUID(uids[i])
		infos[i] = WorkloadInfo{Namespace: w.Namespace(), Name: w.Name}
	}
	b.Run("FindWorkload", func(b *testing.B) {
		lookupLoop(b, func(i int) bool { return s.FindWorkload(infos[i%len(infos)]) != nil })
	})
	// Misses: a destination outside the mesh, and a pod IP dialled
	// directly (ResolveVIP finds no VIP; no CIDR VIP to scan here).
	others := make([]netip.Addr, len(ips))
	for i := range others {
		others[i] = netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)})
	}
	b.Run("WorkloadByAddrMiss", func(b *testing.B) {
		lookupLoop(b, func(i int) bool { return s.WorkloadByAddr("", others[i%len(others)]) == nil })
	})
	b.Run("ResolveVIPMiss", func(b *testing.B) {
		lookupLoop(b, func(i int) bool { return s.ResolveVIP("", ips[i%len(ips)], "ns") == nil })
	})
	b.Run("ResolveVIP+Endpoints", func(b *testing.B) {
		lookupLoop(b, func(i int) bool {
			svc := s.ResolveVIP("", vips[i%len(vips)], "ns")
			return svc != nil && len(s.Endpoints(svc)) > 0
		})
	})
}

// lookupLoop runs lookup over keys 7919 apart (a prime: every key in turn,
// in an order no cache line or prefetcher follows), failing when one is
// not found.
func lookupLoop(b *testing.B, lookup func(i int) bool) {
	b.ReportAllocs()
	i := 0
	start := cpuTime()
	for b.Loop() {
		if !lookup(i) {
			b.Fatal("not found")
		}
		i += 7919
	}
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the process's user and system CPU time so far, in ns.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
