package e2e

// Cases of istio/istio's tests/integration/ambient whose workloads come
// from xDS: a ServiceEntry removed, a service restarted.

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// istioSERemovedTopology places the pods of TestIstioServiceEntryRemoved;
// their workloads and the ServiceEntry come from xDS.
const istioSERemovedTopology = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-uncaptured, name: uncaptured, namespace: default, serviceAccount: uncaptured, workloadIps: ["10.244.2.2"], protocol: TCP, node: node-b, services: {}}
`

const istioSEKey = "default/serviceentry.istio.io"

// startIstioXDSCluster runs topology's pods in dedicated mode on xDS and the
// Istio CA; set fills the xDS server before the daemons start.
func startIstioXDSCluster(t *testing.T, topology string, o labrun.ClusterOptions, set func(*xdstest.Server)) *labrun.Cluster {
	t.Helper()
	lab := netnslab.New(t)
	cp := startControlPlane(t, lab)
	set(cp.xds)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o.Binary, o.Dir = ztunnelBin, t.TempDir()
	o.DaemonEnv = append(o.DaemonEnv, cp.env()...)
	return startCluster(ctx, t, lab, topology, o)
}

// istioSEService is a ServiceEntry of host with one VIP, port 80 to 8080.
func istioSEService(host, vip string) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: host, Namespace: "default", Hostname: host,
		Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(vip).AsSlice()}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
	}}}
}

// istioSEEndpoint makes w an uncaptured endpoint of the ServiceEntry key.
func istioSEEndpoint(a *workloadapi.Address, key string) *workloadapi.Address {
	w := a.GetWorkload()
	w.TunnelProtocol = workloadapi.TunnelProtocol_NONE
	w.Services = map[string]*workloadapi.PortList{key: {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}}
	return a
}

// callName connects from pod to dst and returns what the server wrote
// before closing, "" when nobody answered within 3s.
func callName(ctx context.Context, pod *netnslab.Pod, dst string) string {
	cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
	defer ccancel()
	conn, err := pod.Dial(cctx, "tcp", dst)
	if err != nil {
		return ""
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	got, _ := io.ReadAll(conn)
	return string(got)
}

// TestIstioServiceEntryRemoved is the second half of istio/istio's
// TestServiceEntryDNSWithAutoAssign on xDS: a ServiceEntry (VIP, port 80
// to 8080) selecting an uncaptured pod is reached through its VIP; once
// the control plane removes it, calls to the VIP no longer reach the pod.
func TestIstioServiceEntryRemoved(t *testing.T) {
	xdsRef := new(*xdstest.Server)
	c := startIstioXDSCluster(t, istioSERemovedTopology, labrun.ClusterOptions{}, func(xds *xdstest.Server) {
		*xdsRef = xds
		xds.Set(xdsconv.AddressType, "u-client", "1", xdsWorkload("client", "10.244.1.2", "node-a"))
		xds.Set(xdsconv.AddressType, "u-uncaptured", "1", istioSEEndpoint(xdsWorkload("uncaptured", "10.244.2.2", "node-b"), istioSEKey))
		xds.Set(xdsconv.AddressType, istioSEKey, "1", istioSEService("serviceentry.istio.io", "240.240.240.1"))
	})
	xds := *xdsRef
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(startNamer(t, c.Pods["uncaptured"], 8080, "uncaptured"))
	call := func() string { return callName(ctx, c.Pods["client"], "240.240.240.1:80") }
	if got := call(); got != "uncaptured" {
		t.Fatalf("the ServiceEntry's VIP answered %q, want the uncaptured pod", got)
	}
	xds.Remove(xdsconv.AddressType, istioSEKey)
	gone := false
	for i := 0; i < 100 && !gone; i++ {
		gone = call() == ""
	}
	if !gone {
		t.Fatal("the VIP still reaches the pod 100 calls after the ServiceEntry was removed")
	}
	for i := 0; i < 3; i++ {
		if got := call(); got != "" {
			t.Fatalf("call %d after the removal answered %q", i, got)
		}
	}
}

const istioRestartTopology = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-old, name: old, namespace: default, serviceAccount: web, workloadIps: ["10.244.2.2"], protocol: HBONE, node: node-b, services: {}}
- {uid: u-new, name: new, namespace: default, serviceAccount: web, workloadIps: ["10.244.2.3"], protocol: HBONE, node: node-b, services: {}}
- {uid: u-outsider, name: outsider, namespace: default, serviceAccount: outsider, workloadIps: ["10.244.1.3"], protocol: TCP, node: node-a, services: {}}
`

// kubeProxy stands in for kube-proxy in pod, an uncaptured client: its
// connections to vip:80 are DNATed to one of endpoints (host:port), picked
// at random as kube-proxy's iptables mode picks, and each call replaces the
// set. ztunnel never sees the choice: the connection reaches the chosen
// pod's inbound capture as plaintext.
func kubeProxy(t *testing.T, pod *netnslab.Pod, vip string, endpoints ...string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("*nat\n:ZTLAB-SVC - [0:0]\n") // declaring the chain flushes it
	for i, ep := range endpoints {
		if left := len(endpoints) - i; left > 1 {
			fmt.Fprintf(&b, "-A ZTLAB-SVC -p tcp -m statistic --mode random --probability %.4f -j DNAT --to-destination %s\n", 1/float64(left), ep)
		} else {
			fmt.Fprintf(&b, "-A ZTLAB-SVC -p tcp -j DNAT --to-destination %s\n", ep)
		}
	}
	b.WriteString("COMMIT\n")
	restore := exec.Command("ip", "netns", "exec", pod.NetNS, "iptables-restore", "--noflush", "--wait", "10")
	restore.Stdin = strings.NewReader(b.String())
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("kube-proxy rules: %v: %s", err, out)
	}
	jump := []string{"-t", "nat", "-C", "OUTPUT", "-d", vip + "/32", "-p", "tcp", "--dport", "80", "-j", "ZTLAB-SVC"}
	if exec.Command("ip", append([]string{"netns", "exec", pod.NetNS, "iptables"}, jump...)...).Run() != nil {
		jump[2] = "-A"
		if out, err := exec.Command("ip", append([]string{"netns", "exec", pod.NetNS, "iptables"}, jump...)...).CombinedOutput(); err != nil {
			t.Fatalf("kube-proxy jump: %v: %s", err, out)
		}
	}
}

// TestIstioServiceRestart is istio/istio's TestServiceRestart on xDS, in
// the order Kubernetes replaces a pod: the new pod joins the service, the
// old one leaves the service (while its app still runs), then it is gone.
// Every connection to the service VIP must succeed throughout (istio's
// threshold is 100%), and the traffic moves from the old pod to the new.
// Two clients call: a captured one, balanced by its ztunnel, and an
// uncaptured one, whose calls kube-proxy (kubeProxy) sends to the pods'
// inbound capture; the endpoints it knows follow the same steps.
func TestIstioServiceRestart(t *testing.T) {
	const key = "default/web.default.svc.cluster.local"
	member := func(a *workloadapi.Address) *workloadapi.Address {
		a.GetWorkload().Services = map[string]*workloadapi.PortList{key: {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}}
		return a
	}
	xdsRef := new(*xdstest.Server)
	c := startIstioXDSCluster(t, istioRestartTopology, labrun.ClusterOptions{}, func(xds *xdstest.Server) {
		*xdsRef = xds
		xds.Set(xdsconv.AddressType, "u-client", "1", xdsWorkload("client", "10.244.1.2", "node-a"))
		outsider := xdsWorkload("outsider", "10.244.1.3", "node-a")
		outsider.GetWorkload().TunnelProtocol = workloadapi.TunnelProtocol_NONE
		xds.Set(xdsconv.AddressType, "u-outsider", "1", outsider)
		old := member(xdsWorkload("old", "10.244.2.2", "node-b"))
		old.GetWorkload().ServiceAccount = "web"
		xds.Set(xdsconv.AddressType, "u-old", "1", old)
		nw := xdsWorkload("new", "10.244.2.3", "node-b")
		nw.GetWorkload().ServiceAccount = "web"
		xds.Set(xdsconv.AddressType, "u-new", "1", nw)
		xds.Set(xdsconv.AddressType, key, "1", &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: "web", Namespace: "default", Hostname: "web.default.svc.cluster.local",
			Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr("10.96.0.30").AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
		}}})
	})
	xds := *xdsRef
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, name := range []string{"old", "new"} {
		t.Cleanup(startNamer(t, c.Pods[name], 8080, name))
	}
	const oldEP, newEP = "10.244.2.2:8080", "10.244.2.3:8080"
	kubeProxy(t, c.Pods["outsider"], "10.96.0.30", oldEP)
	outsiderWants := "old" // the pod kube-proxy's rules allow, "" for either
	calls := 0
	call := func() string {
		t.Helper()
		calls++
		got := callName(ctx, c.Pods["client"], "10.96.0.30:80")
		if got != "old" && got != "new" {
			t.Fatalf("call %d to the service failed (%q): every call must succeed", calls, got)
		}
		if out := callName(ctx, c.Pods["outsider"], "10.96.0.30:80"); out != "old" && out != "new" {
			t.Fatalf("call %d of the uncaptured client failed (%q): every call must succeed", calls, out)
		} else if outsiderWants != "" && out != outsiderWants {
			t.Fatalf("call %d of the uncaptured client reached %s, want %s", calls, out, outsiderWants)
		}
		return got
	}
	// until calls until want has answered n times in a row, at most max calls.
	until := func(want string, n, max int) {
		t.Helper()
		run := 0
		for i := 0; i < max && run < n; i++ {
			if call() == want {
				run++
			} else {
				run = 0
			}
		}
		if run < n {
			t.Fatalf("%s did not answer %d calls in a row within %d calls", want, n, max)
		}
	}
	until("old", 5, 5)
	// The new pod joins the service.
	nw := member(xdsWorkload("new", "10.244.2.3", "node-b"))
	nw.GetWorkload().ServiceAccount = "web"
	xds.Set(xdsconv.AddressType, "u-new", "2", nw)
	kubeProxy(t, c.Pods["outsider"], "10.96.0.30", oldEP, newEP)
	outsiderWants = ""
	until("new", 1, 400)
	// The old pod leaves the service; its app still serves.
	old := xdsWorkload("old", "10.244.2.2", "node-b")
	old.GetWorkload().ServiceAccount = "web"
	xds.Set(xdsconv.AddressType, "u-old", "2", old)
	kubeProxy(t, c.Pods["outsider"], "10.96.0.30", newEP)
	outsiderWants = "new"
	until("new", 20, 400)
	// The old pod is gone.
	xds.Remove(xdsconv.AddressType, "u-old")
	until("new", 20, 20)
	t.Logf("%d calls, all served", calls)
}
