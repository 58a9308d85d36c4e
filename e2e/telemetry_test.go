package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ztunnel-go/ztunnel/admin"
	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

// telemetryLayout places the pods (the daemons get the workloads from xDS,
// not from this file): the fake istiod's node "cp" is created first, so
// node-a's pods are 10.244.1.x and node-b's 10.244.2.x.
const telemetryLayout = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-denied, name: denied, namespace: default, serviceAccount: denied, workloadIps: ["10.244.1.3"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.2.2"], protocol: HBONE, node: node-b, services: {}}
`

// noSampleFeature lists the registered families this scenario cannot feed,
// and why; every other family must have samples.
var noSampleFeature = map[string]string{
	"istio_crl_policy_rejections_total":     "CRL enforcement is not configured in this lab",
	"istio_crl_untracked_connections_total": "CRL enforcement is not configured in this lab",
	"istio_crl_load_failures_total":         "CRL enforcement is not configured in this lab (e2e/crl_test.go feeds it)",
	"ztunnel_go_fd_budget_refusals_total":   "no peer exhausts the descriptor budget in this lab (TestFDBudgetFlood feeds it)",
	"ztunnel_go_hbone_peer_refusals_total":  "the per-source caps on 15008 are opt-in, off here (TestInboundPeerLimits feeds it)",
	"ztunnel_go_dns_requests_refused_total": "no DNS client exhausts the forwarding slots in this lab (dnsproxy's TestMeshNamesWhileUpstreamHangs feeds it)",
}

// goldenFamily is one line of metrics/testdata/families.golden: a family
// the daemon registers, with ztunnel's label names.
type goldenFamilyLine struct {
	name   string
	labels []string
}

func readFamiliesGolden(t *testing.T) []goldenFamilyLine {
	t.Helper()
	data, err := os.ReadFile("../metrics/testdata/families.golden")
	if err != nil {
		t.Fatal(err)
	}
	var out []goldenFamilyLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		g := goldenFamilyLine{name: f[0]}
		if f[2] != "-" {
			g.labels = strings.Split(f[2], ",")
		}
		out = append(out, g)
	}
	return out
}

func telemetryWorkload(name, ip, node string, services map[string]*workloadapi.PortList) *workloadapi.Address {
	w := xdsWorkload(name, ip, node)
	w.GetWorkload().Services = services
	w.GetWorkload().CanonicalName, w.GetWorkload().CanonicalRevision = name, "v1"
	return w
}

// TestTelemetryShared runs the two-node shared mode on xDS with the DNS
// proxy, drives every feeder (HBONE traffic to a service, a policy denial,
// an on-demand DNS lookup, DNS answered locally, forwarded and failed
// upstream, a connection flood on readiness, an xDS reconnect, pods coming
// up), then scrapes both daemons: every family the daemon registers has
// samples with ztunnel's label names, and the destination attributes the
// traffic to the service.
func TestTelemetryShared(t *testing.T) {
	lab := netnslab.New(t)
	cp, err := lab.AddNode("cp")
	if err != nil {
		t.Fatal(err)
	}
	xds := newFakeIstiod(t, cp, 15012)
	web := map[string]*workloadapi.PortList{"default/web.default.svc.cluster.local": {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}}
	ext := map[string]*workloadapi.PortList{"default/ext.default.svc.cluster.local": {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 80}}}}
	xds.Set(xdsconv.AddressType, "u-client", "1", telemetryWorkload("client", "10.244.1.2", "node-a", nil))
	xds.Set(xdsconv.AddressType, "u-denied", "1", telemetryWorkload("denied", "10.244.1.3", "node-a", nil))
	xds.Set(xdsconv.AddressType, "u-server", "1", telemetryWorkload("server", "10.244.2.2", "node-b", web))
	// A workload known only by hostname: reaching it needs on-demand DNS.
	xds.Set(xdsconv.AddressType, "u-vm", "1", &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: "u-vm", Name: "vm", Namespace: "default", ServiceAccount: "vm", Hostname: "vm.invalid", Services: ext,
	}}})
	for _, svc := range []struct{ name, vip string }{{"web", "10.96.0.10"}, {"ext", "10.96.0.20"}} {
		xds.Set(xdsconv.AddressType, "default/"+svc.name+".default.svc.cluster.local", "1", &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: svc.name, Namespace: "default", Hostname: svc.name + ".default.svc.cluster.local",
			Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(svc.vip).AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
		}}})
	}
	xds.Set(xdsconv.AuthorizationType, "default/deny-denied", "1", &securityapi.Authorization{
		Name: "deny-denied", Namespace: "default", Scope: securityapi.Scope_NAMESPACE, Action: securityapi.Action_DENY,
		Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{
			Principals: []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Exact{Exact: "cluster.local/ns/default/sa/denied"}}},
		}}}}}},
	})

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, telemetryLayout, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: dir, ExtraPods: map[string][]string{"node-b": {"resolver"}},
		Capture: netnslab.CaptureOptions{RedirectDNS: true},
		DaemonEnv: []string{
			"LOCAL_XDS_PATH=", "FAKE_CA=true", "XDS_ADDRESS=" + xds.Address(), "XDS_ROOT_CA=" + xds.TLS().RootFile,
			"ISTIO_META_DNS_CAPTURE=true", "ZTUNNEL_RESOLV_CONF=" + writeResolvConf(t, dir, "10.244.2.3"),
		},
	})
	startEcho(t, c.Pods["server"], 8080)
	client := c.Pods["client"]

	// HBONE traffic to the service VIP.
	for range 2 {
		conn, err := client.Dial(ctx, "tcp", "10.96.0.10:80")
		if err != nil {
			t.Fatal(err)
		}
		if err := nettest.RoundTrip(conn, "to the service"); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	// While a connection is open, both daemons list it in /config_dump's
	// workloadState as istioctl ztunnel-config connections reads it.
	held, err := client.Dial(ctx, "tcp", "10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	if err := nettest.RoundTrip(held, "held open"); err != nil {
		t.Fatal(err)
	}
	checkConnections(ctx, t, c.Daemons["node-a"], "u-client", "outbound", dumpConn{OriginalDst: "10.96.0.10:80", ActualDst: "10.244.2.2:15008", Protocol: "HBONE"})
	checkConnections(ctx, t, c.Daemons["node-b"], "u-server", "inbound", dumpConn{OriginalDst: "web.default.svc.cluster.local", ActualDst: "10.244.2.2:8080", Protocol: "HBONE"})
	held.Close()
	// A policy denial at the destination.
	if conn, err := c.Pods["denied"].Dial(ctx, "tcp", "10.244.2.2:8080"); err == nil {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		conn.Write([]byte("x"))
		if _, err := io.ReadAll(conn); err == nil {
			t.Log("the denied connection ended without an error")
		}
		conn.Close()
	}
	// The hostname-only endpoint: an on-demand lookup (vm.invalid fails).
	if conn, err := client.Dial(ctx, "tcp", "10.96.0.20:80"); err == nil {
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		io.Copy(io.Discard, conn)
		conn.Close()
	}
	// DNS: answered from the snapshot; forwarded while the resolver is down
	// (a failure); forwarded to the resolver.
	dnsAsk(ctx, t, client, "web.default.svc.cluster.local")
	dnsAsk(ctx, t, client, "external.example.com")
	startFakeResolver(t, c.Pods["resolver"])
	dnsAsk(ctx, t, client, "external.example.com")
	// A connection flood on node-a's readiness port from one peer: past
	// admin.DefaultMaxConnsPerPeer held at once, connections are refused
	// (the held ones stay up to the 2 s head timeout: far longer than the
	// flood takes).
	var flood []net.Conn
	for range 3 * admin.DefaultMaxConnsPerPeer {
		if conn, err := c.Daemons["node-a"].Pod.Dial(ctx, "tcp", "127.0.0.1:15021"); err == nil {
			flood = append(flood, conn)
		}
	}
	for _, conn := range flood {
		conn.Close()
	}
	// An xDS reconnect: the server ends every stream; the daemons resume.
	opened := xds.StreamsOpened()
	xds.CloseStreams()
	if !nettest.Until(time.Minute, func() bool { return xds.StreamsOpened() >= opened+2 }) {
		t.Fatal("the daemons did not reconnect to xDS")
	}

	golden := readFamiliesGolden(t)
	var fams map[string][]*dto.Metric
	// Connections' and DNS metrics land asynchronously.
	nettest.Until(20*time.Second, func() bool {
		fams = map[string][]*dto.Metric{}
		for _, node := range []string{"node-a", "node-b"} {
			for name, f := range scrapeDaemon(ctx, t, c.Daemons[node]) {
				fams[name] = append(fams[name], f.GetMetric()...)
			}
		}
		for _, g := range golden {
			if _, exempt := noSampleFeature[g.name]; !exempt && len(fams[g.name]) == 0 {
				return false
			}
		}
		return true
	})
	for _, g := range golden {
		ms := fams[g.name]
		if why, exempt := noSampleFeature[g.name]; exempt {
			t.Logf("%s: %d samples (not required: %s)", g.name, len(ms), why)
		} else if len(ms) == 0 {
			t.Errorf("family %s is registered but has no sample after the scenario", g.name)
		}
		want := slices.Sorted(slices.Values(g.labels))
		for _, m := range ms {
			var got []string
			for _, l := range m.GetLabel() {
				got = append(got, l.GetName())
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("family %s: labels %v, want ztunnel's %v", g.name, got, want)
				break
			}
		}
	}
	has := func(family string, want map[string]string) bool {
		for _, m := range fams[family] {
			if hasLabels(m, want) {
				return true
			}
		}
		return false
	}
	for _, want := range []struct {
		family string
		labels map[string]string
	}{
		// Both reporters attribute the tunnel to the service.
		{"istio_tcp_connections_opened_total", map[string]string{"reporter": "source", "destination_service": "web.default.svc.cluster.local",
			"destination_workload": "server", "source_principal": "spiffe://cluster.local/ns/default/sa/client", "connection_security_policy": "mutual_tls"}},
		{"istio_tcp_connections_opened_total", map[string]string{"reporter": "destination", "destination_service": "web.default.svc.cluster.local",
			"destination_service_name": "web", "destination_service_namespace": "default", "source_workload": "client", "source_canonical_service": "client"}},
		{"istio_tcp_connections_failed_total", map[string]string{"reporter": "destination", "response_flags": "DENY",
			"source_principal": "spiffe://cluster.local/ns/default/sa/denied"}},
		{"istio_on_demand_dns_total", map[string]string{"hostname": "vm.invalid", "source_workload": "client"}},
		{"istio_xds_connection_terminations_total", map[string]string{"reason": "Complete"}},
		{"istio_xds_message_total", map[string]string{"url": xdsconv.AddressType}},
		{"istio_xds_message_total", map[string]string{"url": xdsconv.AuthorizationType}},
		{"istio_dns_requests_total", map[string]string{"request_query_type": "a", "request_protocol": "udp", "source_canonical_service": "client"}},
		{"ztunnel_go_admin_connections_refused_total", map[string]string{"listener": "readiness", "reason": "peer"}},
	} {
		if !has(want.family, want.labels) {
			t.Errorf("%s has no sample with %v", want.family, want.labels)
		}
	}
}

// dumpConn is a connection of /config_dump's workloadState (the fields
// istioctl ztunnel-config connections prints).
type dumpConn struct {
	Src         string `json:"src"`
	OriginalDst string `json:"originalDst"`
	ActualDst   string `json:"actualDst"`
	Protocol    string `json:"protocol"`
}

// checkConnections waits until d's dump lists, for pod uid, a connection in
// direction like want (Src aside, which is the client's ephemeral port).
func checkConnections(ctx context.Context, t *testing.T, d *labrun.Daemon, uid, direction string, want dumpConn) {
	t.Helper()
	var last string
	found := nettest.Until(time.Minute, func() bool {
		code, body, err := d.Get(ctx, "http://127.0.0.1:15000/config_dump")
		if err != nil || code != 200 {
			t.Fatalf("config_dump: %d %v", code, err)
		}
		var dump struct {
			WorkloadState map[string]struct {
				Connections map[string][]dumpConn `json:"connections"`
			} `json:"workloadState"`
		}
		if err := json.Unmarshal(body, &dump); err != nil {
			t.Fatalf("config_dump: %v", err)
		}
		for _, c := range dump.WorkloadState[uid].Connections[direction] {
			if _, _, err := net.SplitHostPort(c.Src); err == nil {
				c.Src = ""
			}
			if c == want {
				return true
			}
		}
		last = fmt.Sprintf("%+v", dump.WorkloadState[uid].Connections)
		return false
	})
	if found {
		return
	}
	t.Fatalf("%s: %s connections of %s %s, want one like %+v", d.Pod.Name, direction, uid, last, want)
}

// scrapeDaemon fetches and parses d's /metrics.
func scrapeDaemon(ctx context.Context, t *testing.T, d *labrun.Daemon) map[string]*dto.MetricFamily {
	t.Helper()
	code, body, err := d.Get(ctx, "http://127.0.0.1:15020/metrics")
	if err != nil || code != 200 {
		t.Fatalf("scrape %s: %d %v", d.Pod.Name, code, err)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// dnsAsk sends one A query from pod through its captured DNS; the answer
// (or its absence: a failed upstream) does not matter, only that the proxy
// handled it.
func dnsAsk(ctx context.Context, t *testing.T, pod *netnslab.Pod, host string) {
	t.Helper()
	nc, err := pod.Dial(ctx, "udp", "10.244.2.3:53")
	if err != nil {
		t.Fatal(err)
	}
	conn := &dns.Conn{Conn: nc}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(host), dns.TypeA)
	if err := conn.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ReadMsg(); err != nil && !isTimeout(err) {
		t.Logf("dns %s: %v", host, err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
