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
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadName: client-deploy, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
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
	// istiod knows the daemon's own pod, and two twins of the client.
	istiod.Set(xdsconv.AddressType, "u-zt-a", "1", xdsPod("u-zt-a", zt.Pod.Name, "istio-system", "ztunnel", zt.Pod.IP.String(), "node-a", "Kubernetes", "ztunnel"))
	istiod.Set(xdsconv.AddressType, "a-twin-cluster", "1", xdsPod("a-twin-cluster", "client", "default", "client", "10.244.9.9", "node-a", "other", "twin-cluster"))
	istiod.Set(xdsconv.AddressType, "a-twin-node", "1", xdsPod("a-twin-node", "client", "default", "client", "10.244.9.8", "node-b", "Kubernetes", "twin-node"))

	// The self-proxy: the client scrapes the daemon's metrics, which its
	// own node's capture carries over HBONE to the daemon's 15008.
	client := c.Pods["client"]
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return client.Dial(ctx, network, addr)
		},
	}}
	url := fmt.Sprintf("http://%s/metrics", net.JoinHostPort(zt.Pod.IP.String(), "15020"))
	// Until node-a knows the daemon's workload the request goes out as
	// plain passthrough; retry until one went over the self-proxy.
	inbound := []string{`direction="inbound"`, `dst.workload="` + zt.Pod.Name + `"`, `src.identity="spiffe://cluster.local/ns/default/sa/client"`,
		`dst.hbone_addr="` + net.JoinHostPort(zt.Pod.IP.String(), "15020") + `"`, "connection complete",
		"dst.addr=" + net.JoinHostPort(zt.Pod.IP.String(), "15008") + " ", `dst.identity="spiffe://cluster.local/ns/istio-system/sa/ztunnel"`}
	var line string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := hc.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(body), "# TYPE") {
				err = fmt.Errorf("status %d, body %q", resp.StatusCode, body[:min(len(body), 200)])
			}
		}
		if err == nil {
			wctx, wcancel := context.WithTimeout(ctx, time.Second)
			line, err = zt.WaitLog(wctx, inbound...)
			wcancel()
			if err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s from the client over the self-proxy: %v", url, err)
		}
	}
	t.Logf("self-proxy access log: %s", line)
	// The daemon counted each self-proxied request as destination, opened
	// and closed (ztunnel: 1 and 1; a retry above may add one).
	served := 0
	for _, l := range strings.Split(zt.Log(), "\n") {
		if !slices.ContainsFunc(inbound, func(p string) bool { return !strings.Contains(l, p) }) {
			served++
		}
	}
	dst := map[string]string{"reporter": "destination", "destination_principal": "spiffe://cluster.local/ns/istio-system/sa/ztunnel"}
	var got tcpCounts
	eventually(10*time.Second, 50*time.Millisecond, func() bool {
		got = readCounts(ctx, t, zt, dst)
		return got.Opened == float64(served) && got.Closed == float64(served)
	})
	if served != 1 {
		t.Logf("%d self-proxied requests logged (retries)", served)
	}
	if got.Opened != float64(served) || got.Closed != float64(served) || got.Received == 0 || got.Sent == 0 {
		t.Errorf("self-proxy destination counters with %v: %s, want opened=closed=%d (the requests served) and bytes both ways", dst, got, served)
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
