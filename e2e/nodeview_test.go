package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// nodeViewConfig is startupConfig's topology with workload names, which the
// metrics' source_workload label shows.
const nodeViewConfig = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadName: client-deploy, canonicalName: client, canonicalRevision: v1, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-server, name: server, namespace: default, serviceAccount: server, workloadName: server-deploy, workloadIps: ["10.244.2.2"], protocol: HBONE, node: node-b, services: {}}
`

// xdsPod is an HBONE workload as istiod sends it.
func xdsPod(uid, name, namespace, sa, ip, node, cluster, workloadName string) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: uid, Name: name, Namespace: namespace, ServiceAccount: sa, WorkloadName: workloadName,
		Addresses: [][]byte{netip.MustParseAddr(ip).AsSlice()}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		Node: node, ClusterId: cluster,
	}}}
}

// certIdentities returns the identities of the certificates d holds, as
// /config_dump lists them.
func certIdentities(ctx context.Context, t *testing.T, d *labrun.Daemon) []string {
	t.Helper()
	code, body, err := d.Get(ctx, "http://127.0.0.1:15000/config_dump")
	if err != nil || code != 200 {
		t.Fatalf("config_dump: %d %v", code, err)
	}
	var dump struct {
		Certificates []struct {
			Identity string `json:"identity"`
		} `json:"certificates"`
	}
	if err := json.Unmarshal(body, &dump); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range dump.Certificates {
		out = append(out, c.Identity)
	}
	slices.Sort(out)
	return out
}

// TestSharedNodeView holds the daemon to ztunnel's view of its own node:
//   - the self-proxy: a mesh client reaches the daemon's metrics port over
//     HBONE (ztunnel's test_hbone_metrics_access);
//   - the node-local lookup: twins of the client pod (same name, namespace
//     and service account) on another node or in another cluster, with lower
//     UIDs, are never taken for it;
//   - certificates follow the node's workloads: prefetched when the first
//     one with an identity arrives on this node, never for another node's,
//     forgotten when the last leaves (ztunnel's test_prefetch_forget_certs).
func TestSharedNodeView(t *testing.T) {
	lab := netnslab.New(t)
	cp, err := lab.AddNode("cp")
	if err != nil {
		t.Fatal(err)
	}
	istiod := newFakeIstiod(t, cp, 15012)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, nodeViewConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: t.TempDir(),
		DaemonEnv: append(istiod.env(), "SERVICE_ACCOUNT=ztunnel", "ISTIO_META_CLUSTER_ID=Kubernetes", "ISTIO_META_MESH_ID=lab-mesh"),
	})
	zt := c.Daemons["node-a"]
	// What istiod is told: the pod, its node and every ISTIO_META_*.
	first := istiod.WaitRequest(func(r *xdstest.Request) bool {
		return r.Node != nil && r.Node.GetMetadata().GetFields()["NAME"].GetStringValue() == zt.Pod.Name
	})
	meta := first.Node.GetMetadata().AsMap()
	for k, v := range map[string]string{"CLUSTER_ID": "Kubernetes", "MESH_ID": "lab-mesh", "NODE_NAME": "node-a", "NAMESPACE": "istio-system"} {
		if got := meta[k]; got != v {
			t.Errorf("node metadata %s = %v, want %q (all: %v)", k, got, v, meta)
		}
	}
	if _, ok := meta["SERVICE_ACCOUNT"]; ok {
		t.Errorf("node metadata has SERVICE_ACCOUNT, which is no ISTIO_META_ variable: %v", meta)
	}
	if name, _ := meta["NAME"].(string); !strings.HasPrefix(name, "ztunnel-node-") {
		t.Errorf("node metadata lacks the pod and node: %v", meta)
	}
	// istiod knows the daemon's own pod (with the labels of the chart's
	// DaemonSet: app=ztunnel, app.kubernetes.io/version), and two twins of
	// the client.
	ztPod := xdsPod("u-zt-a", zt.Pod.Name, "istio-system", "ztunnel", zt.Pod.IP.String(), "node-a", "Kubernetes", "ztunnel")
	ztPod.GetWorkload().CanonicalName, ztPod.GetWorkload().CanonicalRevision = "ztunnel", "1.29.0"
	istiod.Set(xdsconv.AddressType, "u-zt-a", "1", ztPod)
	istiod.Set(xdsconv.AddressType, "a-twin-cluster", "1", xdsPod("a-twin-cluster", "client", "default", "client", "10.244.9.9", "node-a", "other", "twin-cluster"))
	istiod.Set(xdsconv.AddressType, "a-twin-node", "1", xdsPod("a-twin-node", "client", "default", "client", "10.244.9.8", "node-b", "Kubernetes", "twin-node"))

	// The self-proxy: the client scrapes the daemon's metrics, which its
	// own node's capture carries over HBONE to the daemon's 15008. One
	// request, as ztunnel's test makes, once the daemon knows its own
	// workload (before that the capture passes the request through, which
	// the metrics would not count: the retry the first version of this
	// test needed).
	waitWorkload(ctx, t, zt, zt.Pod.IP)
	client := c.Pods["client"]
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return client.Dial(ctx, network, addr)
		},
	}}
	url := fmt.Sprintf("http://%s/metrics", net.JoinHostPort(zt.Pod.IP.String(), "15020"))
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s from the client over the self-proxy: %v", url, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), "# TYPE") {
		t.Fatalf("GET %s from the client over the self-proxy: status %d, %v, body %q", url, resp.StatusCode, err, body[:min(len(body), 200)])
	}
	inbound := []string{`direction="inbound"`, `dst.workload="` + zt.Pod.Name + `"`, `src.identity="spiffe://cluster.local/ns/default/sa/client"`,
		`dst.hbone_addr="` + net.JoinHostPort(zt.Pod.IP.String(), "15020") + `"`, "connection complete",
		"dst.addr=" + net.JoinHostPort(zt.Pod.IP.String(), "15008") + " ", `dst.identity="spiffe://cluster.local/ns/istio-system/sa/ztunnel"`}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	line, err := zt.WaitLog(wctx, inbound...)
	wcancel()
	if err != nil {
		t.Fatalf("no inbound access log of the self-proxy: %v", err)
	}
	t.Logf("self-proxy access log: %s", line)
	// The daemon counted the one request as destination: opened=1,
	// closed=1 (ztunnel's test_hbone_metrics_access), under Istio's twelve
	// labels of TestZtunnelSecureMetrics (baseline_test.go) with the values
	// it wants: the ztunnel pod's workload, namespace, principal and app
	// labels, the client's, and mutual TLS.
	dst := map[string]string{"reporter": "destination", "destination_principal": "spiffe://cluster.local/ns/istio-system/sa/ztunnel"}
	var got tcpCounts
	eventually(10*time.Second, 50*time.Millisecond, func() bool {
		got = readCounts(ctx, t, zt, dst)
		return got.Opened == 1 && got.Closed == 1
	})
	if got.Opened != 1 || got.Closed != 1 || got.Received == 0 || got.Sent == 0 {
		t.Errorf("self-proxy destination counters with %v: %s, want opened=1 closed=1 and bytes both ways", dst, got)
	}
	istioLabels := map[string]string{
		"reporter":                       "destination",
		"connection_security_policy":     "mutual_tls",
		"destination_workload_namespace": "istio-system",
		"destination_workload":           "ztunnel",
		"destination_principal":          "spiffe://cluster.local/ns/istio-system/sa/ztunnel",
		"destination_canonical_service":  "ztunnel",
		"destination_canonical_revision": "1.29.0",
		"source_workload_namespace":      "default",
		"source_workload":                "client-deploy",
		"source_principal":               "spiffe://cluster.local/ns/default/sa/client",
		"source_canonical_service":       "client",
		"source_canonical_revision":      "v1",
	}
	var samples []string
	for _, m := range scrapeDaemon(ctx, t, zt)["istio_tcp_connections_opened_total"].GetMetric() {
		if hasLabels(m, dst) {
			samples = append(samples, m.String())
			if !hasLabels(m, istioLabels) || m.GetCounter().GetValue() != 1 {
				t.Errorf("self-proxy's destination sample %s, want Istio's labels %v and the value 1", m, istioLabels)
			}
		}
	}
	if len(samples) != 1 {
		t.Errorf("self-proxy's destination samples of istio_tcp_connections_opened_total: %q, want one", samples)
	}

	// The node-local lookup: the client's traffic is reported as the
	// client's, never as a twin's.
	echo := startEcho(t, c.Pods["server"], 8080)
	conn, err := client.Dial(ctx, "tcp", echo.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := nettest.RoundTrip(conn, "hello"); err != nil {
		t.Fatalf("client -> server: %v", err)
	}
	conn.Close()
	_, metrics, err := zt.Get(ctx, "http://127.0.0.1:15020/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, twin := range []string{"twin-cluster", "twin-node"} {
		if strings.Contains(string(metrics), `source_workload="`+twin+`"`) {
			t.Errorf("node-a's metrics report the client's traffic as %s's", twin)
		}
	}
	if !strings.Contains(string(metrics), `source_workload="client-deploy"`) {
		t.Errorf("node-a's metrics have no sample for the client: %s", grepLines(string(metrics), "istio_tcp_connections_opened_total"))
	}

	// Certificates follow the node's workloads.
	const (
		clientID = "spiffe://cluster.local/ns/default/sa/client"
		ztID     = "spiffe://cluster.local/ns/istio-system/sa/ztunnel"
		sa1ID    = "spiffe://cluster.local/ns/default/sa/sa1"
	)
	want := func(help string, ids ...string) {
		t.Helper()
		slices.Sort(ids)
		var got []string
		if eventually(10*time.Second, 50*time.Millisecond, func() bool { got = certIdentities(ctx, t, zt); return slices.Equal(got, ids) }) {
			return
		}
		t.Fatalf("%s: node-a holds certificates for %q, want %q", help, got, ids)
	}
	want("at first: the client pod and the daemon's own", clientID, ztID)
	istiod.Set(xdsconv.AddressType, "id1-remote", "1", xdsPod("id1-remote", "id1-remote", "default", "sa1", "10.244.2.9", "node-b", "Kubernetes", "id1"))
	time.Sleep(300 * time.Millisecond) // a wrong prefetch would start now
	want("a workload on another node is not prefetched", clientID, ztID)
	istiod.Set(xdsconv.AddressType, "id1-a", "1", xdsPod("id1-a", "id1-a", "default", "sa1", "10.244.1.8", "node-a", "Kubernetes", "id1"))
	want("a workload on this node is prefetched", clientID, ztID, sa1ID)
	istiod.Set(xdsconv.AddressType, "id1-b", "1", xdsPod("id1-b", "id1-b", "default", "sa1", "10.244.1.9", "node-a", "Kubernetes", "id1"))
	want("a second one changes nothing", clientID, ztID, sa1ID)
	istiod.Remove(xdsconv.AddressType, "id1-remote")
	time.Sleep(300 * time.Millisecond)
	want("removing the remote one changes nothing", clientID, ztID, sa1ID)
	istiod.Remove(xdsconv.AddressType, "id1-b")
	time.Sleep(300 * time.Millisecond)
	want("one of this node's is left", clientID, ztID, sa1ID)
	istiod.Remove(xdsconv.AddressType, "id1-a")
	want("the last one gone, its certificate is forgotten", clientID, ztID)
}

// waitWorkload waits until d's state holds a workload with address ip, as
// /config_dump lists it.
func waitWorkload(ctx context.Context, t *testing.T, d *labrun.Daemon, ip netip.Addr) {
	t.Helper()
	type dumpWorkload struct {
		WorkloadIPs []string `json:"workloadIps"`
	}
	known := func() bool {
		code, body, err := d.Get(ctx, "http://127.0.0.1:15000/config_dump")
		if err != nil || code != 200 {
			t.Fatalf("config_dump: %d %v", code, err)
		}
		var dump struct {
			Workloads []dumpWorkload `json:"workloads"`
		}
		if err := json.Unmarshal(body, &dump); err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(dump.Workloads, func(w dumpWorkload) bool { return slices.Contains(w.WorkloadIPs, ip.String()) })
	}
	if !eventually(20*time.Second, 50*time.Millisecond, known) {
		t.Fatalf("%s never knew the workload of %s", d.Pod.Name, ip)
	}
}

// grepLines returns the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
