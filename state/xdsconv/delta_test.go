package xdsconv

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/xdsclient"
)

// TestDeltaPublishMatchesFullBuild pushes random Address updates (workloads
// fighting over a few addresses, services coming and going) and checks that
// each snapshot published through the delta path equals a full build of
// what XDSState holds.
func TestDeltaPublishMatchesFullBuild(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x, store := newState(t, nil)
	ips := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}
	for step := range 300 {
		var rs []xdsclient.Resource
		var removed []string
		for range 1 + r.IntN(3) {
			switch r.IntN(5) {
			case 0, 1:
				uid := fmt.Sprintf("c/apps/Deployment/ns/w%d", r.IntN(6))
				if r.IntN(2) == 0 {
					uid = fmt.Sprintf("Kubernetes//Pod/ns/p%d", r.IntN(6))
				}
				mod := func(w *workloadapi.Workload) {
					if r.IntN(3) == 0 {
						w.TunnelProtocol = workloadapi.TunnelProtocol_NONE
					}
				}
				rs = append(rs, res(t, uid, wlAddr(uid, ips[r.IntN(len(ips))], mod, withServices(fmt.Sprintf("ns/s%d.ns.svc.cluster.local", r.IntN(3))))))
			case 2:
				name := fmt.Sprintf("s%d", r.IntN(3))
				rs = append(rs, res(t, "ns/"+name+".ns.svc.cluster.local", svcAddr(name, fmt.Sprintf("10.96.0.%d", 1+r.IntN(3)))))
			case 3:
				if r.IntN(2) == 0 {
					removed = append(removed, fmt.Sprintf("Kubernetes//Pod/ns/p%d", r.IntN(6)))
				} else {
					removed = append(removed, fmt.Sprintf("c/apps/Deployment/ns/w%d", r.IntN(6)))
				}
			default:
				removed = append(removed, fmt.Sprintf("ns/s%d.ns.svc.cluster.local", r.IntN(3)))
			}
		}
		if rej := applyAddrs(t, x, removed, rs...); rej != nil {
			t.Fatalf("step %d: %v", step, rej)
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
			if g, w := endpointUIDs(got, svc.Key()), endpointUIDs(full, svc.Key()); !reflect.DeepEqual(g, w) {
				t.Fatalf("step %d: endpoints of %s: %v, want %v", step, svc.Key(), g, w)
			}
		}
	}
}
