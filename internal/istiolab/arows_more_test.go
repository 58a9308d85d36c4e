//go:build istiolab

package istiolab

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// TestARows' cases for a ServiceEntry selecting pods, traffic leaving the
// mesh, and the daemon's L4 telemetry as istiod's metadata labels it.

func init() {
	arowsCases = append(arowsCases,
		arowsCase{"A9_service_entry_selects_an_uncaptured_pod", testServiceEntrySelectsPod},
		arowsCase{"A7_A12_passthrough_keeps_the_pod_address", testPassthrough},
		arowsCase{"A11_L4_telemetry_of_the_destination", testL4Telemetry},
		arowsCase{"A3_service_balances_per_connection", testPerConnectionLB},
		arowsCase{"A16_daemon_metrics_over_HBONE", testDaemonMetricsOverHBONE},
		arowsCase{"A13_service_pod_replaced_under_traffic", testServiceRestart},
	)
}

// testServiceEntrySelectsPod: a ServiceEntry with a host, a VIP and port
// 80 to 8080 selecting the pod outside the mesh by its labels: the daemon's
// DNS proxy answers the host with the VIP and a call to it reaches the pod.
func testServiceEntrySelectsPod(t *testing.T, l *arowsLab) {
	const host = "pods.example.com"
	vip := netip.MustParseAddr("10.99.0.10")
	l.apply(t, fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: pods, namespace: outside}
spec:
  hosts: [%s]
  addresses: [%s]
  resolution: STATIC
  ports:
  - {number: 80, name: tcp, protocol: TCP, targetPort: %d}
  workloadSelector:
    labels: {app: plain}
`, host, vip, serverPort))
	l.resolves(t, l.client, host, vip)
	l.outbound(t, l.client, netip.AddrPortFrom(vip, 80), `dst.service="`+host+`"`,
		"dst.addr="+netip.AddrPortFrom(l.plain.IP, serverPort).String()+" ", `dst.workload="plain"`)
}

// testPassthrough: a mesh pod's call to an address outside the mesh (an
// echo on the control plane's node, as the API server is) passes through
// its daemon and arrives from the pod's own address.
func testPassthrough(t *testing.T, l *arowsLab) {
	const port = 18080
	peers := startPeerEcho(t, l.cp.Node.NS, port)
	dst := netip.AddrPortFrom(l.cp.Node.IP, port)
	l.outbound(t, l.client, dst, "dst.addr="+dst.String()+" ")
	if line := logLineWith(l.clientLog(), `direction="outbound"`, "dst.addr="+dst.String()+" ", "dst.workload="); line != "" {
		t.Fatalf("the passthrough was logged with a destination workload: %s", line)
	}
	if got := peers.seen(); !got[l.client.IP] {
		t.Fatalf("the destination saw connections from %v, not from the pod's own address %v", got, l.client.IP)
	}
}

// testL4Telemetry: after calls from the client over HBONE, the server's
// daemon reports istio_tcp_connections_opened_total{reporter="destination"}
// with mutual_tls and both sides' labels as istiod's workloads give them
// (the pods' names, namespaces, service accounts and app labels).
func testL4Telemetry(t *testing.T, l *arowsLab) {
	l.reach(t, l.client, serverPort, viaHBONE) // baseline made some; one more
	want := []string{
		`reporter="destination"`,
		`connection_security_policy="mutual_tls"`,
		`source_workload="client"`, `source_workload_namespace="arows"`,
		`source_principal="spiffe://cluster.local/ns/arows/sa/client"`,
		`source_canonical_service="client"`, `source_canonical_revision="latest"`,
		`destination_workload="server"`, `destination_workload_namespace="arows"`,
		`destination_principal="spiffe://cluster.local/ns/arows/sa/server"`,
		`destination_canonical_service="server"`, `destination_canonical_revision="latest"`,
	}
	client := &http.Client{Transport: &http.Transport{DialContext: l.ztunnels[0].Pod.Dial, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	waitUntil(t, time.Minute, func() error {
		resp, err := client.Get("http://127.0.0.1:15020/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		line := logLineWith(string(data), append([]string{"istio_tcp_connections_opened_total{"}, want...)...)
		if line == "" {
			return fmt.Errorf("no istio_tcp_connections_opened_total sample with %v in the server's daemon's /metrics", want)
		}
		fields := strings.Fields(line)
		if v := fields[len(fields)-1]; v == "0" {
			return fmt.Errorf("sample is 0: %s", line)
		}
		t.Logf("%s", line)
		return nil
	})
}

// peerEcho echoes lines and records the addresses connections came from.
type peerEcho struct {
	mu    sync.Mutex
	peers map[netip.Addr]bool
}

func (p *peerEcho) seen() map[netip.Addr]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[netip.Addr]bool, len(p.peers))
	for a := range p.peers {
		out[a] = true
	}
	return out
}

// startPeerEcho listens on port in ns; it stops when the test ends.
func startPeerEcho(t *testing.T, ns netnslab.NS, port int) *peerEcho {
	t.Helper()
	ln, err := ns.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	p := &peerEcho{peers: map[netip.Addr]bool{}}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
				p.mu.Lock()
				p.peers[a.AddrPort().Addr().Unmap()] = true
				p.mu.Unlock()
			}
			wg.Go(func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadBytes('\n')
					if len(line) > 0 {
						if _, werr := c.Write(line); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return p
}

// testPerConnectionLB: a Service with two endpoints (pods started for it
// on the server's node): ten requests on one connection from a mesh client
// land on one endpoint (the daemon balances connections, not requests),
// and connections reach both.
func testPerConnectionLB(t *testing.T, l *arowsLab) {
	ctx := t.Context()
	var echoes []*echoServer
	for _, name := range []string{"lb-1", "lb-2"} {
		pod, _, err := l.cnis[0].RunPod(ctx, PodSpec{Namespace: "arows", Name: name, ServiceAccount: "server",
			Labels: map[string]string{"app": "lb"}})
		if err != nil {
			t.Fatal(err)
		}
		echoes = append(echoes, startEcho(t, pod, serverPort))
	}
	l.apply(t, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: lb, namespace: arows}
spec:
  selector: {app: lb}
  ports:
  - {name: tcp-echo, port: 80, targetPort: %d}
`, serverPort))
	vip, err := netip.ParseAddr(l.kubectl(t, "get", "service", "lb", "-n", "arows", "-o", "jsonpath={.spec.clusterIP}"))
	if err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(vip, 80)
	counts := func() []int { return []int{echoes[0].count(), echoes[1].count()} }
	// Both endpoints known to the client's daemon: wait until each has
	// been reached, one connection of ten requests at a time.
	conns := 0
	waitUntil(t, 2*time.Minute, func() error {
		before := counts()
		if err := callRequests(ctx, l.client, dst, 10); err != nil {
			return err
		}
		after := counts()
		if got := after[0] + after[1] - before[0] - before[1]; got != 1 {
			t.Fatalf("one connection of ten requests reached the endpoints %d times (%v to %v)", got, before, after)
		}
		conns++
		if after[0] == 0 || after[1] == 0 {
			return fmt.Errorf("after %d connections the endpoints saw %v", conns, after)
		}
		return nil
	})
	t.Logf("%d connections of ten requests each, each on one endpoint; the endpoints saw %v", conns, counts())
}

// callRequests sends n lines on one connection from pod to dst and wants
// each echoed before the next.
func callRequests(ctx context.Context, pod *netnslab.Pod, dst netip.AddrPort, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pod.Dial(ctx, "tcp", dst.String())
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	for i := range n {
		msg := fmt.Appendf(nil, "request %d\n", i)
		if _, err := conn.Write(msg); err != nil {
			return err
		}
		got, err := r.ReadBytes('\n')
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("request %d: echo %q, want %q", i, got, msg)
		}
	}
	return nil
}

// testDaemonMetricsOverHBONE: the server node's daemon pod labelled
// networking.istio.io/tunnel=http (the podLabels Istio's ambient suite
// installs ztunnel with), a mesh client GETs its /metrics on the pod's
// address: the client's daemon tunnels to the daemon's own HBONE port (its
// self-proxy), and the daemon reports the connection as its destination
// with both sides' labels.
func testDaemonMetricsOverHBONE(t *testing.T, l *arowsLab) {
	z := l.ztunnels[0]
	name := "ztunnel-" + z.Pod.Node.Name
	l.kubectl(t, "label", "pod", name, "-n", IstioNamespace, "networking.istio.io/tunnel=http")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = l.cp.Kubectl(ctx, "", "label", "pod", name, "-n", IstioNamespace, "networking.istio.io/tunnel-")
	})
	url := "http://" + netip.AddrPortFrom(z.Pod.IP, 15020).String() + "/metrics"
	client := &http.Client{Transport: &http.Transport{DialContext: l.client.Dial, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	hbone := []string{`direction="outbound"`, "src.addr=" + l.client.IP.String() + ":",
		"dst.addr=" + netip.AddrPortFrom(z.Pod.IP, 15008).String() + " ",
		`dst.hbone_addr="` + netip.AddrPortFrom(z.Pod.IP, 15020).String() + `"`,
		`dst.identity="spiffe://cluster.local/ns/istio-system/sa/ztunnel"`}
	var body string
	waitUntil(t, time.Minute, func() error {
		before := logLinesWith(l.clientLog(), hbone...)
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), "# TYPE") {
			return fmt.Errorf("GET %s: %s, %d bytes without # TYPE", url, resp.Status, len(data))
		}
		body = string(data)
		return waitLog(func() bool { return logLinesWith(l.clientLog(), hbone...) > before },
			"GET %s answered, but the client's daemon logged no HBONE connection to the daemon's pod", url)
	})
	t.Logf("through HBONE: %s", logLineWith(l.clientLog(), hbone...))
	want := []string{
		"istio_tcp_connections_opened_total{",
		`reporter="destination"`, `connection_security_policy="mutual_tls"`,
		`destination_workload="` + name + `"`, `destination_workload_namespace="istio-system"`,
		`destination_principal="spiffe://cluster.local/ns/istio-system/sa/ztunnel"`,
		`destination_canonical_service="ztunnel"`,
		`source_workload="client"`, `source_workload_namespace="arows"`,
		`source_principal="spiffe://cluster.local/ns/arows/sa/client"`,
	}
	// The connection is counted when it opens: the sample may be in the
	// body just read, else in the next scrape.
	waitUntil(t, time.Minute, func() error {
		if line := logLineWith(body, want...); line != "" {
			t.Logf("%s", line)
			return nil
		}
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(data)
		if err != nil {
			return err
		}
		return fmt.Errorf("no sample with %v in the daemon's /metrics", want)
	})
}

// testServiceRestart: Istio's TestServiceRestart. A Service's one pod is
// replaced while a mesh client and the pod outside the mesh call the
// Service's VIP back to back, in Kubernetes' order: the new pod starts and
// joins, the old one turns not Ready (its kubelet's status as it
// terminates), then its object goes. The mesh client's daemon resolves the
// VIP from istiod's state; the uncaptured client's calls take the lab's
// kube-proxy rules on its node, kept in step with the EndpointSlice as
// kube-proxy does, to the pods' inbound capture. Every call of both
// succeeds and the traffic moves to the new pod.
func testServiceRestart(t *testing.T, l *arowsLab) {
	ctx := t.Context()
	start := func(name string) (*netnslab.Pod, *echoServer) {
		pod, _, err := l.cnis[0].RunPod(ctx, PodSpec{Namespace: "arows", Name: name, ServiceAccount: "server",
			Labels: map[string]string{"app": "restart"}})
		if err != nil {
			t.Fatal(err)
		}
		return pod, startEcho(t, pod, serverPort)
	}
	oldPod, oldEcho := start("restart-1")
	l.apply(t, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: restart, namespace: arows}
spec:
  selector: {app: restart}
  ports:
  - {name: tcp-echo, port: 80, targetPort: %d}
`, serverPort))
	vip, err := netip.ParseAddr(l.kubectl(t, "get", "service", "restart", "-n", "arows", "-o", "jsonpath={.spec.clusterIP}"))
	if err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(vip, 80)

	// kube-proxy on the uncaptured client's node: the Services' rules
	// rendered from the API server's state, reloaded when they change.
	var proxyWG sync.WaitGroup
	proxyCtx, stopProxy := context.WithCancel(ctx)
	defer func() { stopProxy(); proxyWG.Wait() }()
	var (
		proxyMu  sync.Mutex
		proxyErr error
		reloads  int
	)
	proxyWG.Go(func() {
		var programmed []byte
		for {
			rules, err := l.cp.serviceRules(proxyCtx)
			if err == nil && !bytes.Equal(rules, programmed) {
				if err = programServices(proxyCtx, l.plain.Node, rules); err == nil {
					programmed = rules
					proxyMu.Lock()
					reloads++
					proxyMu.Unlock()
				}
			}
			if err != nil && proxyCtx.Err() == nil {
				proxyMu.Lock()
				proxyErr = err
				proxyMu.Unlock()
			}
			select {
			case <-proxyCtx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	clients := []*netnslab.Pod{l.client, l.plain}
	for _, c := range clients {
		waitUntil(t, time.Minute, func() error { return call(ctx, c, dst) })
	}

	load := startCallLoad(ctx, clients, dst)
	defer load.halt()

	_, newEcho := start("restart-2")
	waitUntil(t, time.Minute, func() error {
		if newEcho.count() == 0 {
			return fmt.Errorf("the new pod has no connection yet (the old one %d)", oldEcho.count())
		}
		return nil
	})
	// The old pod terminates: its kubelet reports it not Ready, then
	// deletes it once its containers stopped.
	now := time.Now().UTC().Format(time.RFC3339)
	if err := l.cp.patchStatus(ctx, "pod", "arows", "restart-1", map[string]any{"conditions": []map[string]string{
		{"type": "Ready", "status": "False", "lastTransitionTime": now},
		{"type": "ContainersReady", "status": "False", "lastTransitionTime": now},
	}}); err != nil {
		t.Fatal(err)
	}
	// Once the old pod takes no more connections for 100 calls in a row
	// (both clients'), it is out of the Service for both.
	waitUntil(t, time.Minute, func() error {
		before, calls := oldEcho.count(), load.calls()
		if !nettest.Until(time.Minute, func() bool { return load.calls() >= calls+100 }) {
			return fmt.Errorf("the clients made fewer than 100 calls in a minute")
		}
		if oldEcho.count() != before {
			return fmt.Errorf("the old pod still takes connections")
		}
		return nil
	})
	l.kubectl(t, "delete", "pod", "restart-1", "-n", "arows", "--grace-period=0", "--force")
	// A few more calls after the old pod's object went.
	calls := load.calls()
	waitUntil(t, time.Minute, func() error {
		if n := load.calls(); n < calls+100 {
			return fmt.Errorf("%d calls since the old pod went, want 100", n-calls)
		}
		return nil
	})
	load.halt()
	stopProxy()
	proxyWG.Wait()
	proxyMu.Lock()
	t.Logf("the uncaptured client's node: kube-proxy rules loaded %d times; last error: %v", reloads, proxyErr)
	proxyMu.Unlock()
	t.Logf("old pod %v: %d connections, new: %d", oldPod.IP, oldEcho.count(), newEcho.count())
	for _, c := range clients {
		n := load.tally(c)
		t.Logf("%s: %d calls through the replacement, %d failed", c.Name, n.calls(), n.failed)
		if n.failed > 0 {
			t.Errorf("%s: %d of %d calls failed while the Service's pod was replaced, want none; first: %s",
				c.Name, n.failed, n.calls(), n.first)
		}
	}
}
