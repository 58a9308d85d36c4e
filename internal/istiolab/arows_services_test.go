//go:build istiolab

package istiolab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// TestARows' cases for Services, ServiceEntries and WorkloadEntries, the
// DNS proxy behind istio-cni's DNS capture, and pods joining and leaving
// the mesh by label.

func init() {
	arowsCases = append(arowsCases,
		arowsCase{"A1_service_VIP_from_a_mesh_client", testServiceVIP},
		arowsCase{"A1_app_on_localhost_only_is_not_reachable", testLocalhostOnly},
		arowsCase{"A8_A10_service_entry_inline_endpoint_auto_allocated_VIP", testServiceEntryInline},
		arowsCase{"A8_service_entry_selects_a_workload_entry", testServiceEntryWorkloadEntry},
		arowsCase{"A15_pod_opted_out_is_not_captured", testOptedOut},
		arowsCase{"A15_namespace_and_pod_labels_enrol_and_unenrol_a_running_pod", testNamespaceRelabel},
		arowsCase{"A15_destination_leaves_and_rejoins_under_traffic", testDynamicEnrolUnderTraffic},
	)
}

// echoServiceYAML selects the server pods, port 80 to their serverPort.
var echoServiceYAML = fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: echo, namespace: arows}
spec:
  selector: {app: server}
  ports:
  - {name: tcp-echo, port: 80, targetPort: %d}
`, serverPort)

// testServiceVIP: a Service selecting the server (the API server allocates
// its ClusterIP; istiod reads the Service and the pods): a mesh client
// resolves its name through the daemon's DNS proxy (istio-cni's DNS
// capture) and calls the VIP, which its daemon sends to the server over
// HBONE; the pod outside the mesh calls it through kube-proxy's rules on
// its node, and the server sees its own address.
func testServiceVIP(t *testing.T, l *arowsLab) {
	l.apply(t, echoServiceYAML)
	vip, err := netip.ParseAddr(l.kubectl(t, "get", "service", "echo", "-n", "arows", "-o", "jsonpath={.spec.clusterIP}"))
	if err != nil {
		t.Fatal(err)
	}
	const host = "echo.arows.svc.cluster.local"
	l.resolves(t, l.client, host, vip)
	dst := netip.AddrPortFrom(vip, 80)
	l.outbound(t, l.client, dst, `dst.service="`+host+`"`,
		`dst.hbone_addr="`+netip.AddrPortFrom(l.server.IP, serverPort).String()+`"`)

	// A client outside the mesh: its node's kube-proxy rules (the lab's,
	// services.go, from the Service's EndpointSlice) send the VIP to the
	// server, whose daemon takes it in plaintext from the client's own
	// address.
	ctx := t.Context()
	waitUntil(t, time.Minute, func() error {
		rules, err := l.cp.serviceRules(ctx)
		if err != nil {
			return err
		}
		if !strings.Contains(string(rules), vip.String()) || !strings.Contains(string(rules), l.server.IP.String()) {
			return fmt.Errorf("no kube-proxy rule from %v to %v yet (no EndpointSlice?)", vip, l.server.IP)
		}
		return programServices(ctx, l.plain.Node, rules)
	})
	plain := viaPlaintext
	waitUntil(t, time.Minute, func() error {
		before := l.inbound(l.plain, serverPort, &plain, "")
		if err := call(ctx, l.plain, dst); err != nil {
			return fmt.Errorf("%s to %v: %w", l.plain.Name, dst, err)
		}
		return waitLog(func() bool { return l.inbound(l.plain, serverPort, &plain, "") > before },
			"%s to %v succeeded, but the server's daemon logged no plaintext connection from its address", l.plain.Name, dst)
	})
}

// localhostPort is where testLocalhostOnly's app of the server listens.
const localhostPort = 7070

// testLocalhostOnly: Istio's LocalhostIP case. An app of the server pod
// listening on 127.0.0.1 only is not reachable through the mesh: the
// server's daemon dials the pod's own address for an inbound connection,
// as ztunnel does, and nothing listens there, so the mesh client's call
// fails (Istio accepts an error or a 503) and the daemon logs the refusal;
// the app never sees a connection. The same port bound on the pod's
// address is reached over HBONE.
func testLocalhostOnly(t *testing.T, l *arowsLab) {
	local := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), localhostPort)
	ln, err := l.server.Listen("tcp", local.String())
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_, _ = c.Write([]byte("localhost app\n"))
			c.Close()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	// The app answers on localhost, in the pod.
	conn, err := l.server.Dial(t.Context(), "tcp", local.String())
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(conn)
	conn.Close()
	if string(got) != "localhost app\n" || accepted.Load() != 1 {
		t.Fatalf("the localhost app from its own pod: %q (%v), %d connections; want its answer", got, err, accepted.Load())
	}
	l.refused(t, l.client, localhostPort, "connect: connection refused")
	if n := accepted.Load(); n != 1 {
		t.Fatalf("the app listening on localhost only took %d connections through the mesh", n-1)
	}
	startEchoAt(t, l.server, netip.AddrPortFrom(l.server.IP, localhostPort).String())
	l.reach(t, l.client, localhostPort, viaHBONE)
}

// testServiceEntryInline: a ServiceEntry with no address and an inline
// endpoint (the pod outside the mesh), STATIC, port 80 to 8080: istiod
// allocates its VIP (status.addresses), the daemon's DNS proxy answers the
// host with it, and a call to it reaches the endpoint through the client's
// daemon; deleted, the ServiceEntry's VIP reaches nothing.
func testServiceEntryInline(t *testing.T, l *arowsLab) {
	const host = "inline.example.com"
	l.apply(t, fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: inline, namespace: outside}
spec:
  hosts: [%s]
  resolution: STATIC
  ports:
  - {number: 80, name: tcp, protocol: TCP, targetPort: %d}
  endpoints:
  - address: %s
`, host, serverPort, l.plain.IP))
	vip := l.allocatedVIP(t, "outside", "inline")
	l.resolves(t, l.client, host, vip)
	dst := netip.AddrPortFrom(vip, 80)
	l.outbound(t, l.client, dst, `dst.service="`+host+`"`,
		"dst.addr="+netip.AddrPortFrom(l.plain.IP, serverPort).String()+" ")

	// A10: the ServiceEntry deleted, its VIP leads nowhere.
	l.kubectl(t, "delete", "serviceentry", "inline", "-n", "outside")
	waitUntil(t, time.Minute, func() error {
		if err := call(t.Context(), l.client, dst); err == nil {
			return fmt.Errorf("%s to %v still succeeds after the ServiceEntry's deletion", l.client.Name, dst)
		}
		return nil
	})
}

// testServiceEntryWorkloadEntry: as the inline case, the endpoint a
// WorkloadEntry the ServiceEntry selects by label.
func testServiceEntryWorkloadEntry(t *testing.T, l *arowsLab) {
	const host = "selected.example.com"
	l.apply(t, fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: plain-we, namespace: outside}
spec:
  address: %s
  labels: {app: plain-we}
  serviceAccount: plain
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: selected, namespace: outside}
spec:
  hosts: [%s]
  resolution: STATIC
  ports:
  - {number: 80, name: tcp, protocol: TCP, targetPort: %d}
  workloadSelector:
    labels: {app: plain-we}
`, l.plain.IP, host, serverPort))
	vip := l.allocatedVIP(t, "outside", "selected")
	l.resolves(t, l.client, host, vip)
	l.outbound(t, l.client, netip.AddrPortFrom(vip, 80), `dst.service="`+host+`"`,
		"dst.addr="+netip.AddrPortFrom(l.plain.IP, serverPort).String()+" ")
}

// testOptedOut: a pod labelled istio.io/dataplane-mode=none in a namespace
// in the mesh: istio-cni leaves it alone (no annotation, no rules), and its
// calls reach the server in plaintext.
func testOptedOut(t *testing.T, l *arowsLab) {
	if got := l.redirection(t, "arows", "optout"); got != "" {
		t.Fatalf("arows/optout: ambient.istio.io/redirection=%q, want none", got)
	}
	// istio-cni's rules are in the enrolled pods, not in this one.
	for _, pod := range []*netnslab.Pod{l.client, l.optout} {
		rules, err := pod.Command(t.Context(), l.mode.rules[0], l.mode.rules[1:]...).Output()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(rules), l.mode.want); got != (pod == l.client) {
			t.Fatalf("%s: %s holds %q: %v\n%s", pod.Name, strings.Join(l.mode.rules, " "), l.mode.want, got, rules)
		}
	}
	l.reach(t, l.optout, serverPort, viaPlaintext)
}

// testNamespaceRelabel: a running pod in a namespace outside the mesh; the
// namespace labelled ambient, istio-cni enrols the pod (its namespace and
// pod watches, the pod's netns found through its process), the daemon takes
// it and its calls go over HBONE with its identity; the pod labelled
// istio.io/dataplane-mode=none leaves (the pod watch) and, the label
// removed, joins again; the namespace's label removed, it leaves and calls
// are plaintext again.
func testNamespaceRelabel(t *testing.T, l *arowsLab) {
	if got := l.redirection(t, "joiner", "joiner"); got != "" {
		t.Fatalf("joiner/joiner: ambient.istio.io/redirection=%q before its namespace joined", got)
	}
	l.reach(t, l.joiner, serverPort, viaPlaintext)

	l.kubectl(t, "label", "namespace", "joiner", "istio.io/dataplane-mode=ambient")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = l.cp.Kubectl(ctx, "", "label", "namespace", "joiner", "istio.io/dataplane-mode-")
	})
	l.waitRedirection(t, "joiner", "joiner", "enabled", "after its namespace joined")
	l.reach(t, l.joiner, serverPort, viaHBONE)
	id := `src.identity="spiffe://cluster.local/ns/joiner/sa/joiner"`
	if logLineWith(l.serverLog(), `direction="inbound"`, "src.addr="+l.joiner.IP.String()+":", id) == "" {
		t.Fatalf("no inbound line from the joined pod with %s", id)
	}

	// The pod itself opted out while its namespace is in the mesh (the
	// pod watch), then back in.
	l.kubectl(t, "label", "pod", "joiner", "-n", "joiner", "istio.io/dataplane-mode=none")
	l.waitRedirection(t, "joiner", "joiner", "", "after the pod opted out")
	l.reach(t, l.joiner, serverPort, viaPlaintext)
	l.kubectl(t, "label", "pod", "joiner", "-n", "joiner", "istio.io/dataplane-mode-")
	l.waitRedirection(t, "joiner", "joiner", "enabled", "after the pod's opt-out was removed")
	l.reach(t, l.joiner, serverPort, viaHBONE)

	l.kubectl(t, "label", "namespace", "joiner", "istio.io/dataplane-mode-")
	l.waitRedirection(t, "joiner", "joiner", "", "after its namespace left")
	l.reach(t, l.joiner, serverPort, viaPlaintext)
}

// waitRedirection waits for the pod's ambient.istio.io/redirection to be
// want; when says after what, for the error.
func (l *arowsLab) waitRedirection(t *testing.T, namespace, name, want, when string) {
	t.Helper()
	waitUntil(t, time.Minute, func() error {
		if got := l.redirection(t, namespace, name); got != want {
			return fmt.Errorf("%s/%s: ambient.istio.io/redirection=%q %s, want %q", namespace, name, got, when, want)
		}
		return nil
	})
}

// redirection returns the pod's ambient.istio.io/redirection annotation,
// which istio-cni sets once it captured the pod.
func (l *arowsLab) redirection(t *testing.T, namespace, name string) string {
	t.Helper()
	return l.kubectl(t, "get", "pod", name, "-n", namespace, "-o",
		`jsonpath={.metadata.annotations.ambient\.istio\.io/redirection}`)
}

// allocatedVIP waits for istiod's IP auto-allocation to give the
// ServiceEntry an address (its status.addresses) and returns it.
func (l *arowsLab) allocatedVIP(t *testing.T, namespace, name string) netip.Addr {
	t.Helper()
	var vip netip.Addr
	waitUntil(t, time.Minute, func() error {
		out := l.kubectl(t, "get", "serviceentry", name, "-n", namespace, "-o", "jsonpath={.status.addresses[*].value}")
		for s := range strings.FieldsSeq(out) {
			if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
				vip = a
				return nil
			}
		}
		return fmt.Errorf("serviceentry %s/%s: no IPv4 address allocated yet (%q)", namespace, name, out)
	})
	t.Logf("%s/%s: istiod allocated %v", namespace, name, vip)
	return vip
}

// clusterDNS is where a pod's resolv.conf would send its queries; nothing
// answers there in the lab: istio-cni's DNS capture sends them to the
// pod's daemon.
var clusterDNS = netip.MustParseAddrPort("10.96.0.10:53")

// resolves waits until host resolves, from pod, to want: a DNS query over
// UDP to the cluster's resolver, which istio-cni's rules redirect to the
// daemon's DNS proxy.
func (l *arowsLab) resolves(t *testing.T, pod *netnslab.Pod, host string, want netip.Addr) {
	t.Helper()
	waitUntil(t, time.Minute, func() error {
		got, err := lookupA(t.Context(), pod, host)
		if err != nil {
			return err
		}
		for _, a := range got {
			if a == want {
				return nil
			}
		}
		return fmt.Errorf("%s from %s: %v, want %v", host, pod.Name, got, want)
	})
}

// lookupA asks clusterDNS from pod for host's A records.
func lookupA(ctx context.Context, pod *netnslab.Pod, host string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pod.Dial(ctx, "udp", clusterDNS.String())
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(host), dns.TypeA)
	c := &dns.Client{Timeout: 3 * time.Second}
	r, _, err := c.ExchangeWithConnContext(ctx, q, &dns.Conn{Conn: conn})
	if err != nil {
		return nil, fmt.Errorf("%s from %s: %w", host, pod.Name, err)
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("%s from %s: %s", host, pod.Name, dns.RcodeToString[r.Rcode])
	}
	var addrs []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				addrs = append(addrs, ip)
			}
		}
	}
	return addrs, nil
}

// outbound waits until a call from pod to dst succeeds and the pod's
// daemon (node2's) logs it outbound with every part.
func (l *arowsLab) outbound(t *testing.T, from *netnslab.Pod, dst netip.AddrPort, parts ...string) {
	t.Helper()
	parts = append([]string{"connection complete", `direction="outbound"`, "src.addr=" + from.IP.String() + ":"}, parts...)
	t.Cleanup(func() {
		if t.Failed() {
			l.logConfigDump(t, l.ztunnels[1], dst.Addr().String(), ".example.com", l.plain.IP.String())
		}
	})
	waitUntil(t, 2*time.Minute, func() error {
		before := logLinesWith(l.clientLog(), parts...)
		if err := call(t.Context(), from, dst); err != nil {
			return fmt.Errorf("%s to %v: %w", from.Name, dst, err)
		}
		return waitLog(func() bool { return logLinesWith(l.clientLog(), parts...) > before },
			"%s to %v succeeded, but its daemon logged no outbound line with %q", from.Name, dst, parts)
	})
	t.Logf("%s to %v: %s", from.Name, dst, logLineWith(l.clientLog(), parts...))
}

// logConfigDump logs the workloads and services of a daemon's /config_dump
// that mention any of parts: what istiod gave it, for a failure.
func (l *arowsLab) logConfigDump(t *testing.T, z *Ztunnel, parts ...string) {
	client := &http.Client{Transport: &http.Transport{DialContext: z.Pod.Dial, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Get("http://127.0.0.1:15000/config_dump")
	if err != nil {
		t.Logf("config_dump: %v", err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Logf("config_dump: %v", err)
		return
	}
	var dump struct {
		Workloads []json.RawMessage `json:"workloads"`
		Services  []json.RawMessage `json:"services"`
	}
	if err := json.Unmarshal(data, &dump); err != nil {
		t.Logf("config_dump: %v", err)
		return
	}
	for _, raw := range append(dump.Services, dump.Workloads...) {
		for _, p := range parts {
			if strings.Contains(string(raw), p) {
				t.Logf("%s's config_dump: %s", z.Pod.Name, raw)
				break
			}
		}
	}
}

// testDynamicEnrolUnderTraffic: Istio's TestServiceDynamicEnroll. A mesh
// client and the pod outside the mesh call the joiner pod back to back
// while its namespace joins the mesh (istio-cni enrols the running pod and
// the daemon takes it: the mesh client's calls arrive over HBONE) and
// leaves it again; at least half of each client's calls succeed, as
// Istio's test asks.
func testDynamicEnrolUnderTraffic(t *testing.T, l *arowsLab) {
	ctx := t.Context()
	startEcho(t, l.joiner, serverPort)
	dst := netip.AddrPortFrom(l.joiner.IP, serverPort)
	load := startCallLoad(ctx, []*netnslab.Pod{l.client, l.plain}, dst)
	defer load.halt()

	// The joiner's own daemon (node2's) logs the mesh client's calls
	// arriving over HBONE once the pod is enrolled.
	joinerLog := l.clientLog
	hbone := []string{`direction="inbound"`, "src.addr=" + l.client.IP.String() + ":",
		`dst.hbone_addr="` + dst.String() + `"`, `src.identity="spiffe://cluster.local/ns/arows/sa/client"`}
	before := logLinesWith(joinerLog(), hbone...)
	l.kubectl(t, "label", "namespace", "joiner", "istio.io/dataplane-mode=ambient")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = l.cp.Kubectl(ctx, "", "label", "namespace", "joiner", "istio.io/dataplane-mode-")
	})
	l.waitRedirection(t, "joiner", "joiner", "enabled", "after its namespace joined")
	waitUntil(t, time.Minute, func() error {
		if logLinesWith(joinerLog(), hbone...) <= before {
			return fmt.Errorf("the mesh client's calls to the enrolled pod do not arrive over HBONE yet")
		}
		return nil
	})
	l.kubectl(t, "label", "namespace", "joiner", "istio.io/dataplane-mode-")
	l.waitRedirection(t, "joiner", "joiner", "", "after its namespace left")
	// A few more calls after it left.
	after := load.tally(l.client).calls()
	waitUntil(t, time.Minute, func() error {
		if n := load.tally(l.client).calls(); n < after+20 {
			return fmt.Errorf("%d calls since the pod left, want 20", n-after)
		}
		return nil
	})
	load.halt()
	// What the mesh client's daemon said of the calls it could not
	// complete, for the figures.
	failures := map[string]int{}
	for line := range strings.Lines(l.clientLog()) {
		if strings.Contains(line, "src.addr="+l.client.IP.String()+":") && strings.Contains(line, l.joiner.IP.String()+":") {
			if _, e, ok := strings.Cut(line, "error="); ok {
				failures[strings.TrimSpace(e)]++
			}
		}
	}
	t.Logf("the mesh client's daemon on its failed calls: %v", failures)
	for _, p := range []*netnslab.Pod{l.client, l.plain} {
		c := load.tally(p)
		t.Logf("%s: %d of %d calls succeeded while the destination joined and left the mesh; failures: %v", p.Name, c.ok, c.calls(), c.errs)
		if c.ok*2 < c.calls() {
			t.Errorf("%s: %d of %d calls succeeded, want at least half", p.Name, c.ok, c.calls())
		}
	}
}

// callLoad calls one destination from each of its clients back to back
// until halt, and tallies each client's results: the traffic Istio's
// tests keep up while a pod or its namespace changes under it.
type callLoad struct {
	mu     sync.Mutex // guards counts' values
	counts map[*netnslab.Pod]*callTally
	stop   chan struct{}
	wg     sync.WaitGroup
	halted bool
}

// callTally is one client's results.
type callTally struct {
	ok, failed int
	first      string         // the first failure's text
	errs       map[string]int // failures by the error's words, without addresses
}

// calls is how many calls the client made.
func (c callTally) calls() int { return c.ok + c.failed }

// startCallLoad starts the calls of every client to dst.
func startCallLoad(ctx context.Context, clients []*netnslab.Pod, dst netip.AddrPort) *callLoad {
	l := &callLoad{counts: map[*netnslab.Pod]*callTally{}, stop: make(chan struct{})}
	for _, c := range clients {
		n := &callTally{errs: map[string]int{}}
		l.counts[c] = n
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				err := call(ctx, c, dst)
				l.mu.Lock()
				if err == nil {
					n.ok++
				} else {
					if n.failed == 0 {
						n.first = err.Error()
					}
					n.failed++
					n.errs[errorWords(err)]++
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

// tally returns client's results so far.
func (l *callLoad) tally(client *netnslab.Pod) callTally {
	l.mu.Lock()
	defer l.mu.Unlock()
	return *l.counts[client]
}

// calls is how many calls every client made so far.
func (l *callLoad) calls() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.counts {
		n += c.calls()
	}
	return n
}

// halt stops the calls and waits for the last (once; later calls do
// nothing). Only the test's goroutine calls it.
func (l *callLoad) halt() {
	if !l.halted {
		l.halted = true
		close(l.stop)
		l.wg.Wait()
	}
}

// errorWords is err's text after its last address (dial and read errors
// name the connection's ports, which differ on every call).
func errorWords(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}
