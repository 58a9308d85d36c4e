package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// The scenarios of ztunnel's tests/namespaced.rs that carry traffic
// (docs/ztunnel-scenarios.md, rows 1-7 and 16 here, the waypoint rows 8-15
// in scenarios_waypoint_test.go): the same client and server
// programs as ztunnel's (the client writes "hello world" and wants it back
// twice, the server reads and writes each chunk twice), so the counters and
// access-log byte counts are ztunnel's numbers: 11 bytes up, 22 down.

const (
	helloMsg  = "hello world"
	helloSize = len(helloMsg)
)

// startDoubler runs ztunnel's ReadDoubleWrite test server on port in pod:
// every chunk read is written back twice; it half-closes when the client
// does.
func startDoubler(t *testing.T, pod *netnslab.Pod, port uint16) {
	t.Helper()
	servePod(t, pod, port, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := c.Write(append(buf[:n:n], buf[:n]...)); werr != nil {
					return
				}
			}
			if err != nil {
				c.(*net.TCPConn).CloseWrite()
				return
			}
		}
	})
}

// helloDouble is ztunnel's client against the doubler: connect from pod to
// dst, write "hello world", read it back twice, close.
func helloDouble(ctx context.Context, pod *netnslab.Pod, dst string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pod.Dial(ctx, "tcp", dst)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, helloMsg); err != nil {
		return err
	}
	got := make([]byte, 2*helloSize)
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read %q: %w", got, err)
	}
	if want := helloMsg + helloMsg; string(got) != want {
		return fmt.Errorf("read %q, want %q", got, want)
	}
	return nil
}

// tcpCounts are the four TCP families ztunnel's namespaced tests check.
type tcpCounts struct{ Opened, Closed, Received, Sent float64 }

func (c tcpCounts) minus(o tcpCounts) tcpCounts {
	return tcpCounts{c.Opened - o.Opened, c.Closed - o.Closed, c.Received - o.Received, c.Sent - o.Sent}
}

func (c tcpCounts) String() string {
	return fmt.Sprintf("opened=%v closed=%v received=%v sent=%v", c.Opened, c.Closed, c.Received, c.Sent)
}

// readCounts scrapes d and sums the TCP families over the samples whose
// labels include labels.
func readCounts(ctx context.Context, t *testing.T, d *labrun.Daemon, labels map[string]string) tcpCounts {
	t.Helper()
	fams := scrapeDaemon(ctx, t, d)
	return tcpCounts{
		Opened:   sum(fams, "istio_tcp_connections_opened_total", labels),
		Closed:   sum(fams, "istio_tcp_connections_closed_total", labels),
		Received: sum(fams, "istio_tcp_received_bytes_total", labels),
		Sent:     sum(fams, "istio_tcp_sent_bytes_total", labels),
	}
}

// checkCounts polls d (at most 10s) until the TCP counters with labels,
// less base, are want; it fails the test with the last values otherwise.
// Connections close asynchronously in the daemon, so the values may lag
// the client's close by a little.
func checkCounts(ctx context.Context, t *testing.T, d *labrun.Daemon, labels map[string]string, base, want tcpCounts) {
	t.Helper()
	var got tcpCounts
	eventually(10*time.Second, 20*time.Millisecond, func() bool {
		got = readCounts(ctx, t, d, labels).minus(base)
		return got == want
	})
	if got != want {
		t.Errorf("%s: TCP counters with %v: %s, want %s", d.Pod.Name, labels, got, want)
	}
}

// logMatch reports which of want's fields the JSON log line fails (ztunnel's
// telemetry::testing::assert_contains: an empty value means the field must
// be absent); ok is false for a line that is no JSON object.
func logMatch(line string, want map[string]string) (misses []string, ok bool) {
	var rec map[string]any
	dec := json.NewDecoder(strings.NewReader(line))
	dec.UseNumber()
	if dec.Decode(&rec) != nil {
		return nil, false
	}
	for k, v := range want {
		have, present := rec[k]
		var s string
		switch h := have.(type) {
		case string:
			s = h
		case json.Number:
			s = h.String()
		default:
			if present {
				s = fmt.Sprint(h)
			}
		}
		switch {
		case v == "" && present:
			misses = append(misses, fmt.Sprintf("%s=%q present, want absent", k, s))
		case v != "" && !present:
			misses = append(misses, fmt.Sprintf("%s missing, want %q", k, v))
		case v != "" && s != v:
			misses = append(misses, fmt.Sprintf("%s=%q, want %q", k, s, v))
		}
	}
	sort.Strings(misses)
	return misses, true
}

// checkAccessLog waits (at most 10s) until d (LOG_FORMAT=json) has logged
// a line with every field of want, and fails with the closest line
// otherwise.
func checkAccessLog(ctx context.Context, t *testing.T, d *labrun.Daemon, want map[string]string) {
	t.Helper()
	var best []string
	found := nettest.Until(10*time.Second, func() bool {
		best = nil
		for _, line := range strings.Split(d.Log(), "\n") {
			misses, ok := logMatch(line, want)
			if !ok {
				continue
			}
			if len(misses) == 0 {
				return true
			}
			if best == nil || len(misses) < len(best) {
				best = misses
			}
		}
		return ctx.Err() != nil
	})
	if found && ctx.Err() == nil {
		return
	}
	t.Errorf("%s: no access log line with %v; the closest one differs in %v", d.Pod.Name, want, best)
}

// scenTrafficConfig serves both modes of the client/server scenarios.
// node-a: client and local (HBONE: captured); node-b: remote (HBONE);
// node-c: plain and outsider, TCP workloads (uncaptured: no capture rules
// and no daemon of their own, in both modes).
const scenTrafficConfig = `
workloads:
- {uid: cluster1//v1/Pod/default/client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: cluster1//v1/Pod/default/local, name: local, namespace: default, serviceAccount: local, workloadIps: ["10.244.0.3"], protocol: HBONE, node: node-a, services: {}}
- {uid: cluster1//v1/Pod/default/remote, name: remote, namespace: default, serviceAccount: remote, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-b, services: {}}
- {uid: cluster1//v1/Pod/default/plain, name: plain, namespace: default, serviceAccount: plain, workloadIps: ["10.244.2.2"], protocol: TCP, node: node-c, services: {}}
- {uid: cluster1//v1/Pod/default/outsider, name: outsider, namespace: default, serviceAccount: outsider, workloadIps: ["10.244.2.3"], protocol: TCP, node: node-c, services: {}}
`

// trafficLab is a running cluster of either mode, seen the same way.
type trafficLab struct {
	pods map[string]*netnslab.Pod
	// daemon is the daemon serving a captured pod.
	daemon func(pod string) *labrun.Daemon
}

func (l *trafficLab) captured(pod string) bool { return pod != "plain" && pod != "outsider" }

func startTrafficLab(t *testing.T, shared bool, config string) *trafficLab {
	t.Helper()
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := []string{"LOG_FORMAT=json"}
	if shared {
		c := startSharedCluster(ctx, t, lab, config, labrun.SharedOptions{Binary: ztunnelBin, Dir: t.TempDir(), DaemonEnv: env})
		return &trafficLab{pods: c.Pods, daemon: func(pod string) *labrun.Daemon { return c.Daemons[c.Pods[pod].Node.Name] }}
	}
	c := startCluster(ctx, t, lab, config, labrun.ClusterOptions{Binary: ztunnelBin, Dir: t.TempDir(), DaemonEnv: env})
	return &trafficLab{pods: c.Pods, daemon: func(pod string) *labrun.Daemon { return c.Daemons[pod] }}
}

func spiffe(sa string) string { return "spiffe://cluster.local/ns/default/sa/" + sa }

// TestScenarioClientServer is ztunnel's simple_client_server_test over its
// cases (rows 1-7 of docs/ztunnel-scenarios.md), and the case the
// *_client_uncaptured_* names promise but their bodies never run (an
// uncaptured client into a captured pod). One connection per case: each
// captured side's daemon counts opened=1 closed=1, received 11 and sent 22
// for its reporter, and logs "connection complete" with the byte counts
// from its side; both identities when both sides are captured (mTLS), none
// otherwise.
func TestScenarioClientServer(t *testing.T) {
	cases := []struct {
		name     string
		from, to string
	}{
		{"same node captured", "client", "local"},                     // row 1, shared
		{"captured client to uncaptured server", "client", "plain"},   // rows 2, 3, 5, 6 (their bodies)
		{"uncaptured client to captured server", "outsider", "local"}, // rows 3, 6 (their names)
		{"cross node captured", "client", "remote"},                   // rows 4, 7
	}
	for _, mode := range []string{"shared", "dedicated"} {
		t.Run(mode, func(t *testing.T) {
			l := startTrafficLab(t, mode == "shared", scenTrafficConfig)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for _, to := range []string{"local", "remote", "plain"} {
				startDoubler(t, l.pods[to], 8080)
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					mtls := l.captured(tc.from) && l.captured(tc.to)
					ids := map[string]string{"src.identity": "", "dst.identity": ""}
					policy := "unknown"
					if mtls {
						ids = map[string]string{"src.identity": spiffe(tc.from), "dst.identity": spiffe(tc.to)}
						policy = "mutual_tls"
					}
					type side struct {
						d        *labrun.Daemon
						reporter string
						labels   map[string]string
						base     tcpCounts
					}
					var sides []*side
					if l.captured(tc.from) {
						sides = append(sides, &side{d: l.daemon(tc.from), reporter: "source"})
					}
					if l.captured(tc.to) {
						sides = append(sides, &side{d: l.daemon(tc.to), reporter: "destination"})
					}
					for _, s := range sides {
						s.labels = map[string]string{"reporter": s.reporter, "source_workload": tc.from,
							"destination_workload": tc.to, "connection_security_policy": policy}
						s.base = readCounts(ctx, t, s.d, s.labels)
					}
					dst := netip.AddrPortFrom(l.pods[tc.to].IP, 8080).String()
					if err := helloDouble(ctx, l.pods[tc.from], dst); err != nil {
						t.Fatalf("%s -> %s: %v", tc.from, dst, err)
					}
					for _, s := range sides {
						checkCounts(ctx, t, s.d, s.labels, s.base, tcpCounts{1, 1, float64(helloSize), float64(2 * helloSize)})
						want := map[string]string{"scope": "access", "message": "connection complete",
							"src.workload": tc.from, "dst.workload": tc.to}
						for k, v := range ids {
							want[k] = v
						}
						if s.reporter == "source" {
							want["direction"], want["bytes_sent"], want["bytes_recv"] = "outbound", "11", "22"
						} else {
							want["direction"], want["bytes_sent"], want["bytes_recv"] = "inbound", "22", "11"
						}
						checkAccessLog(ctx, t, s.d, want)
					}
				})
			}
		})
	}
}

// scenLBConfig is ztunnel's service_loadbalancing layout as the scenario
// map describes it: the service "service" (VIP 10.96.0.10, port 80) has a
// TCP endpoint on the client's node (server1, uncaptured) and an HBONE
// endpoint on the other node (server2), both serving it on 8080.
const scenLBConfig = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.0.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-server1, name: server1, namespace: default, serviceAccount: server1, workloadIps: ["10.244.0.3"], protocol: TCP, node: node-a, services: {"default/service.default.svc.cluster.local": {80: 8080}}}
- {uid: u-server2, name: server2, namespace: default, serviceAccount: server2, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-b, services: {"default/service.default.svc.cluster.local": {80: 8080}}}
services:
- {name: service, namespace: default, hostname: service.default.svc.cluster.local, vips: ["/10.96.0.10"], ports: {80: 80}}
`

// TestScenarioServiceLoadBalancing is ztunnel's service_loadbalancing (row
// 16 of docs/ztunnel-scenarios.md) in shared mode: one connection to the
// VIP reaches exactly one endpoint (from the source reporter's
// destination_principal) and is counted 1/1/11/22 under the service's
// labels; 50 more reach both; the remote endpoint's daemon reports the
// service labels and its principal as destination.
func TestScenarioServiceLoadBalancing(t *testing.T) {
	for _, tc := range []struct{ name, config string }{
		{"local TCP endpoint", scenLBConfig},
		// ztunnel's body: its builder captures every workload of a node
		// with a ztunnel, so the node-local endpoint is HBONE there.
		{"local HBONE endpoint", strings.Replace(scenLBConfig, `protocol: TCP, node: node-a`, `protocol: HBONE, node: node-a`, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) { testServiceLoadBalancing(t, tc.config) })
	}
}

func testServiceLoadBalancing(t *testing.T, config string) {
	l := startTrafficLab(t, true, config)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, name := range []string{"server1", "server2"} {
		startDoubler(t, l.pods[name], 8080)
	}
	local, remote := l.daemon("client"), l.daemon("server2")
	const vip = "10.96.0.10:80"
	if err := helloDouble(ctx, l.pods["client"], vip); err != nil {
		t.Fatalf("client -> %s: %v", vip, err)
	}
	one := tcpCounts{1, 1, float64(helloSize), float64(2 * helloSize)}
	checkCounts(ctx, t, local, map[string]string{"reporter": "source"}, tcpCounts{}, one)
	opened := func(d *labrun.Daemon, labels map[string]string) float64 {
		return readCounts(ctx, t, d, labels).Opened
	}
	to1 := opened(local, map[string]string{"reporter": "source", "destination_principal": spiffe("server1")})
	to2 := opened(local, map[string]string{"reporter": "source", "destination_principal": spiffe("server2")})
	if to1+to2 != 1 {
		t.Errorf("one connection: opened to server1 %v, to server2 %v; want exactly one of them 1", to1, to2)
	}
	svcLabels := map[string]string{
		"reporter": "source", "destination_service": "service.default.svc.cluster.local",
		"destination_service_name": "service", "destination_service_namespace": "default",
	}
	checkCounts(ctx, t, local, svcLabels, tcpCounts{}, one)

	for i := range 50 {
		if err := helloDouble(ctx, l.pods["client"], vip); err != nil {
			t.Fatalf("connection %d to %s: %v", i, vip, err)
		}
	}
	var total float64
	for _, sa := range []string{"server1", "server2"} {
		n := opened(local, map[string]string{"reporter": "source", "destination_principal": spiffe(sa)})
		if n == 0 {
			t.Errorf("51 connections: none to %s", sa)
		}
		total += n
	}
	if total != 51 {
		t.Errorf("51 connections: %v opened to server1 or server2, want each to exactly one", total)
	}
	dstLabels := map[string]string{
		"reporter": "destination", "destination_service": "service.default.svc.cluster.local",
		"destination_service_name": "service", "destination_service_namespace": "default",
		"destination_principal": spiffe("server2"),
	}
	if n := opened(remote, dstLabels); n == 0 {
		t.Errorf("%s: no connection opened with %v", remote.Pod.Name, dstLabels)
	}
}
