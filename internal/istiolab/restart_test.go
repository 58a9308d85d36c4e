//go:build istiolab

package istiolab

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// drainDeadline is the daemon's drain deadline under the chart's grace
// period (TERMINATION_GRACE_PERIOD_SECONDS=30): 5 s less, as ztunnel's.
const drainDeadline = ZtunnelGrace - 5*time.Second

// TestZtunnelRollout replaces the daemon on each node in turn as the
// ztunnel chart's DaemonSet rolling update does (maxSurge 1, maxUnavailable
// 0), under calls from a client on each node to a server on node1: a new
// daemon pod (its own Pod object, token and address) is started beside the
// old one; istio-cni's agent hands it every pod of the node over ZDS (its
// snapshot, on the new connection), it starts their proxies only once it
// has synced istiod's xDS, and it holds the pods' certificates from
// istiod's CA; then the old pod is deleted (SIGTERM) and drains. New calls keep succeeding: none
// may fail. A connection established through the old daemon keeps working
// until the drain deadline (25 s after SIGTERM), where the old daemon
// closes it, as ztunnel does.
func TestZtunnelRollout(t *testing.T) {
	m := startTrafficMesh(t)
	ctx := t.Context()
	root, err := m.cp.RootCert(ctx, IstioNamespace)
	if err != nil {
		t.Fatal(err)
	}
	// A client outside the mesh on node2 (opted out by its label): its
	// calls reach the server's inbound passthrough, in plaintext through
	// node1's daemon, which the rollout replaces too.
	plain, _, err := m.cnis[1].RunPod(ctx, PodSpec{Namespace: "demo", Name: "plain", ServiceAccount: "client",
		Labels: map[string]string{"app": "plain", "istio.io/dataplane-mode": "none"}})
	if err != nil {
		t.Fatal(err)
	}
	m.waitPassthrough(t, m.ztunnels[0], plain)
	load := startCallLoop(ctx, m.clients, m.dst)
	plainLoad := startCallLoop(ctx, []*netnslab.Pod{plain}, m.dst)
	start := time.Now()
	// Each node's workloads, whose certificates its daemon holds.
	identities := [][]string{
		{"spiffe://cluster.local/ns/demo/sa/server", "spiffe://cluster.local/ns/demo/sa/client"},
		{"spiffe://cluster.local/ns/demo/sa/client"},
	}
	for i, old := range m.ztunnels {
		node := old.Pod.Node
		// Connections through this node's daemon: node1's relays both
		// clients' (the server's inbound), node2's the far client's.
		var long []*longConn
		for _, c := range m.clients {
			if c.Node == node || m.server.Node == node {
				long = append(long, openLong(t, c, m.dst))
			}
		}
		began := time.Now()
		next := m.startZtunnel(t, node, old.Name+"-r2", nil)
		t.Logf("%s: new daemon %s ready in %v", node.Name, next.Name, time.Since(began).Round(100*time.Millisecond))
		// It took istiod's xDS, was handed the node's pods by istio-cni on
		// its own ZDS connection, and got their certificates from istiod's
		// CA.
		if m.xdsConnections(next) == 0 {
			t.Fatalf("istiod logged no xDS connection of %s", next.Name)
		}
		if synced, served := firstLineWith(next.Log(), "xds: synced"), firstLineWith(next.Log(), `proxy started	workload="demo/`); synced < 0 || served < synced {
			t.Fatalf("%s started a pod's proxy (line %d) before it synced istiod's xDS (line %d):\n%s", next.Name, served, synced, next.Log())
		}
		if n := logLinesWith(next.Log(), "received snapshot"); n != 1 {
			t.Fatalf("%s took %d ZDS snapshots, want 1:\n%s", next.Name, n, next.Log())
		}
		waitUntil(t, time.Minute, func() error { return holdsDumpCerts(ctx, next.Pod, root, identities[i]) })

		sigterm := time.Now()
		terminated := make(chan error, 1)
		go func() { terminated <- m.cp.TerminateZtunnel(ctx, old, ZtunnelGrace) }()
		// The established connections ride the drain: each keeps working
		// until the old daemon's deadline.
		// cut: when a round trip on it first failed; lastOK: its last
		// success while the old daemon ran.
		cut := make([]time.Duration, len(long))
		lastOK := make([]time.Duration, len(long))
	drain:
		for slices.Contains(cut, 0) {
			for j, l := range long {
				if cut[j] != 0 {
					continue
				}
				if err := l.roundTrip(); err != nil {
					cut[j] = time.Since(sigterm)
					t.Logf("%s: the connection from %s failed %v after SIGTERM: %v",
						node.Name, l.from, cut[j].Round(100*time.Millisecond), err)
				} else {
					lastOK[j] = time.Since(sigterm)
				}
			}
			select {
			case <-old.Exited():
				break drain
			case <-time.After(250 * time.Millisecond):
			}
		}
		termErr := <-terminated
		gone := time.Since(sigterm)
		t.Logf("%s: old daemon %s gone %v after SIGTERM", node.Name, old.Name, gone.Round(100*time.Millisecond))
		for j, l := range long {
			if cut[j] == 0 {
				// The daemon closed what it still relayed when it ended.
				if err := l.roundTrip(); err == nil {
					t.Errorf("%s: the connection from %s outlived the old daemon that relayed it", node.Name, l.from)
					continue
				}
				cut[j] = gone
			}
			t.Logf("%s: the connection from %s worked until %v after SIGTERM, closed by %v",
				node.Name, l.from, lastOK[j].Round(100*time.Millisecond), cut[j].Round(100*time.Millisecond))
			if lastOK[j] == 0 {
				t.Errorf("%s: the connection from %s never worked after SIGTERM", node.Name, l.from)
			}
			if cut[j] < drainDeadline {
				t.Errorf("%s: the connection from %s was cut %v after SIGTERM, before the drain deadline (%v)",
					node.Name, l.from, cut[j].Round(100*time.Millisecond), drainDeadline)
			}
		}
		if termErr != nil {
			t.Fatalf("%s: %v", old.Name, termErr)
		}
		if out, err := m.cp.Kubectl(ctx, "", "get", "pod", old.Name, "-n", IstioNamespace, "--ignore-not-found", "-o", "name"); err != nil || len(out) != 0 {
			t.Fatalf("%s's Pod object: %q (%v), want it deleted", old.Name, out, err)
		}
		m.ztunnels[i] = next
	}
	// After both rollouts the new daemons carry the calls.
	for _, c := range m.clients {
		m.waitHBONE(t, m.ztunnels[0], c)
	}
	m.waitPassthrough(t, m.ztunnels[0], plain)
	ok, failed, errs := load.finish()
	t.Logf("rollout of both nodes' daemons under load: %d calls in %v, %d failed %q",
		ok+failed, time.Since(start).Round(100*time.Millisecond), failed, errs)
	if failed != 0 {
		t.Errorf("%d of %d calls failed during the rollouts", failed, ok+failed)
	}
	// Istio's TestZtunnelRestart asks >= 90% of the uncaptured client's
	// calls to succeed.
	ok, failed, errs = plainLoad.finish()
	t.Logf("the uncaptured client through the server's inbound passthrough: %d calls, %d failed %q", ok+failed, failed, errs)
	if ok*10 < (ok+failed)*9 {
		t.Errorf("%d of %d of the uncaptured client's calls succeeded during the rollouts, want >= 90%%", ok, ok+failed)
	}
}

// holdsDumpCerts checks that the daemon in pod holds a certificate for each of
// ids, chaining to istiod's root.
func holdsDumpCerts(ctx context.Context, pod *netnslab.Pod, root []byte, ids []string) error {
	certs, err := configDumpCerts(ctx, pod)
	if err != nil {
		return err
	}
	for _, id := range ids {
		c, err := dumpCertFor(certs, id, root)
		if err != nil {
			return err
		}
		if c == nil {
			return fmt.Errorf("no certificate for %s in /config_dump", id)
		}
	}
	return nil
}

// TestIstiodRestart kills istiod and starts it again under calls between
// the mesh's pods: the calls go on while it is away (the daemons serve from
// their last state and certificates), each daemon reconnects to the new
// istiod (its xDS stream ended, istio_xds_connection_terminations_total; the
// new istiod logs the daemon's new connection), and an AuthorizationPolicy
// applied after the restart reaches the daemons and takes effect.
func TestIstiodRestart(t *testing.T) {
	m := startTrafficMesh(t)
	ctx := t.Context()
	connected := m.xdsConnections
	before := make([]int, len(m.ztunnels))
	for i, z := range m.ztunnels {
		before[i] = connected(z)
		if before[i] == 0 {
			t.Fatalf("istiod logged no xDS connection of %s", z.Name)
		}
	}
	load := startCallLoop(ctx, m.clients, m.dst)
	start := time.Now()
	if err := m.cp.StopIstiod(); err != nil {
		t.Fatal(err)
	}
	t.Logf("istiod stopped in %v", time.Since(start).Round(time.Millisecond))
	// Each daemon saw its stream end; calls go on meanwhile.
	for _, z := range m.ztunnels {
		waitUntil(t, time.Minute, func() error {
			n, _, err := daemonMetric(ctx, z.Pod, "istio_xds_connection_terminations_total")
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("%s: no xDS connection termination counted", z.Name)
			}
			return nil
		})
	}
	// Calls with no istiod at all, not just in its last moments.
	okDown, _ := load.counts()
	waitUntil(t, time.Minute, func() error {
		if ok, _ := load.counts(); ok < okDown+40 {
			return fmt.Errorf("%d calls completed since istiod stopped, want 40", ok-okDown)
		}
		return nil
	})
	if err := m.cp.StartIstiod(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("istiod back in %v after it stopped", time.Since(start).Round(100*time.Millisecond))
	for i, z := range m.ztunnels {
		waitUntil(t, 2*time.Minute, func() error {
			if n := connected(z); n <= before[i] {
				return fmt.Errorf("%s has not reconnected to the new istiod", z.Name)
			}
			return nil
		})
		_, samples, _ := daemonMetric(ctx, z.Pod, "istio_xds_connection_terminations_total")
		t.Logf("%s: its stream to the old istiod ended: %s; reconnected (%s): %s", z.Name, lastLineWith(z.Log(), "xds: stream 1 "),
			strings.Join(samples, ", "), lastLineWith(z.Log(), "xds: stream"))
	}
	ok, failed, errs := load.finish()
	t.Logf("istiod restarted under load: %d calls in %v, %d failed %q", ok+failed, time.Since(start).Round(100*time.Millisecond), failed, errs)
	if failed != 0 {
		t.Errorf("%d of %d calls failed across istiod's restart", failed, ok+failed)
	}

	// A policy written after the restart reaches the daemons through the
	// new istiod.
	if _, err := m.cp.Kubectl(ctx, denyClientYAML, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	for _, c := range m.clients {
		denied := []string{"connection complete", `direction="inbound"`, "src.addr=" + c.IP.String() + ":",
			`error="connection closed due to policy rejection: explicitly denied by: demo/deny-client"`}
		waitUntil(t, time.Minute, func() error {
			if err := call(ctx, c, m.dst); err == nil {
				return fmt.Errorf("%s: the call still succeeds under the DENY policy applied after the restart", c.Name)
			}
			if logLineWith(m.ztunnels[0].Log(), denied...) == "" {
				return fmt.Errorf("%s: the call failed, but the server's daemon logged no policy rejection", c.Name)
			}
			return nil
		})
	}
	if _, err := m.cp.Kubectl(ctx, "", "delete", "authorizationpolicy", "deny-client", "-n", "demo"); err != nil {
		t.Fatal(err)
	}
	for _, c := range m.clients {
		waitUntil(t, time.Minute, func() error { return call(ctx, c, m.dst) })
	}
}

// daemonMetric reads a counter family on the daemon's metrics port (15020)
// in pod: the sum of its samples and the samples as exposed.
func daemonMetric(ctx context.Context, pod *netnslab.Pod, family string) (float64, []string, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: pod.Dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:15020/metrics", nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	var sum float64
	var samples []string
	for line := range strings.Lines(string(data)) {
		if !strings.HasPrefix(line, family+"{") && !strings.HasPrefix(line, family+" ") {
			continue
		}
		f := strings.Fields(line)
		var v float64
		if _, err := fmt.Sscan(f[len(f)-1], &v); err != nil {
			return 0, nil, fmt.Errorf("%s: %q: %w", family, line, err)
		}
		sum += v
		samples = append(samples, strings.TrimSpace(strings.TrimPrefix(line, family)))
	}
	return sum, samples, nil
}
