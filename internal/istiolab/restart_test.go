//go:build istiolab

package istiolab

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// mesh is the lab the restart tests share: two nodes with istio-cni and the
// daemon, a namespace in the mesh, a server (echo on 8080) on node1, a
// client beside it and one on node2, each client's first call seen through
// HBONE by the server's daemon.
type mesh struct {
	cp       *ControlPlane
	lab      *netnslab.Lab
	bin      string
	cnis     []*CNI
	ztunnels []*Ztunnel
	server   *netnslab.Pod
	clients  []*netnslab.Pod // client-near (node1), client-far (node2)
	dst      netip.AddrPort
}

// startMesh brings the mesh up; zEnv goes to every daemon, over the chart's.
func startMesh(t *testing.T, zEnv ...string) *mesh {
	t.Helper()
	cp, lab := startControlPlane(t)
	ctx := t.Context()
	m := &mesh{cp: cp, lab: lab, bin: ztunnelBinary(t)}
	for i := range 2 {
		name := fmt.Sprintf("node%d", i+1)
		node, err := lab.AddNode(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := cp.RegisterNode(ctx, node); err != nil {
			t.Fatal(err)
		}
		cni, err := cp.StartCNI(ctx, CNIOptions{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := cni.Stop(); err != nil {
				t.Error(err)
			}
		})
		m.cnis = append(m.cnis, cni)
		m.ztunnels = append(m.ztunnels, m.startZtunnel(t, node, "ztunnel-"+name, zEnv))
	}
	if _, err := cp.Kubectl(ctx, demoNamespaceYAML, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	var err error
	m.server, _, err = m.cnis[0].RunPod(ctx, PodSpec{Namespace: "demo", Name: "server", ServiceAccount: "server",
		Labels: map[string]string{"app": "server"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"client-near", "client-far"} {
		c, _, err := m.cnis[i].RunPod(ctx, PodSpec{Namespace: "demo", Name: name, ServiceAccount: "client",
			Labels: map[string]string{"app": "client"}})
		if err != nil {
			t.Fatal(err)
		}
		m.clients = append(m.clients, c)
	}
	startEcho(t, m.server, 8080)
	m.dst = netip.AddrPortFrom(m.server.IP, 8080)
	for _, c := range m.clients {
		m.waitHBONE(t, m.ztunnels[0], c)
	}
	return m
}

// startZtunnel starts a daemon named name on node, taking its pods from
// the node's istio-cni; it is stopped when the test ends.
func (m *mesh) startZtunnel(t *testing.T, node *netnslab.Node, name string, env []string) *Ztunnel {
	t.Helper()
	var cni *CNI
	for _, c := range m.cnis {
		if c.Node == node {
			cni = c
		}
	}
	zpod, err := node.AddPod(name)
	if err != nil {
		t.Fatal(err)
	}
	z, err := m.cp.StartZtunnel(t.Context(), ZtunnelOptions{Binary: m.bin, Pod: zpod, InpodUDS: cni.ZDSPath, Name: name, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := z.Stop(); err != nil {
			t.Error(err)
		}
	})
	return z
}

// xdsConnections counts the delta xDS streams istiod's log shows z opening
// (istiod names a connection by its proxy's ID, pod.namespace, and a
// counter).
func (m *mesh) xdsConnections(z *Ztunnel) int {
	log, _ := os.ReadFile(m.cp.LogPath("istiod"))
	return logLinesWith(string(log), "ADS: new delta connection for node:"+z.Name+"."+IstioNamespace+"-")
}

// waitHBONE waits until a call from c reaches the server and server (the
// server's node's daemon) logs it inbound over HBONE with both identities.
func (m *mesh) waitHBONE(t *testing.T, server *Ztunnel, c *netnslab.Pod) {
	t.Helper()
	parts := []string{"connection complete", `direction="inbound"`, "src.addr=" + c.IP.String() + ":",
		`src.identity="spiffe://cluster.local/ns/demo/sa/client"`, `dst.identity="spiffe://cluster.local/ns/demo/sa/server"`}
	waitUntil(t, 2*time.Minute, func() error {
		before := logLinesWith(server.Log(), parts...)
		if err := call(t.Context(), c, m.dst); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if logLinesWith(server.Log(), parts...) > before {
				return nil
			}
		}
		return fmt.Errorf("%s: the call succeeded, but %s logged no inbound HBONE connection from it", c.Name, server.Name)
	})
}

// callLoad makes calls from each client to dst back to back (a pause of
// callPause between two) until finish, counting successes and failures.
type callLoad struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex // guards the following fields
	ok     int
	failed int
	errs   []string // the first few failures, with when they happened
}

const callPause = 50 * time.Millisecond

func startCallLoad(ctx context.Context, clients []*netnslab.Pod, dst netip.AddrPort) *callLoad {
	l := &callLoad{stop: make(chan struct{})}
	for _, c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				err := call(ctx, c, dst)
				l.mu.Lock()
				if err == nil {
					l.ok++
				} else {
					l.failed++
					if len(l.errs) < 10 {
						l.errs = append(l.errs, fmt.Sprintf("%s %s: %v", time.Now().UTC().Format("15:04:05.000"), c.Name, err))
					}
				}
				l.mu.Unlock()
				select {
				case <-l.stop:
					return
				case <-ctx.Done():
					return
				case <-time.After(callPause):
				}
			}
		}()
	}
	return l
}

// counts returns the calls made so far.
func (l *callLoad) counts() (ok, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok, l.failed
}

// finish stops the load and returns its counts and first failures.
func (l *callLoad) finish() (ok, failed int, errs []string) {
	close(l.stop)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok, l.failed, l.errs
}

// longConn is a connection held open from a client to the echo server.
type longConn struct {
	from string
	conn net.Conn
}

// openLong opens a connection from c to dst and checks one round trip.
func openLong(t *testing.T, c *netnslab.Pod, dst netip.AddrPort) *longConn {
	t.Helper()
	conn, err := c.Dial(t.Context(), "tcp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	l := &longConn{from: c.Name, conn: conn}
	if err := l.roundTrip(); err != nil {
		t.Fatalf("%s: %v", c.Name, err)
	}
	return l
}

// roundTrip sends a line and reads it back.
func (l *longConn) roundTrip() error {
	_ = l.conn.SetDeadline(time.Now().Add(5 * time.Second))
	msg := []byte("still there?\n")
	if _, err := l.conn.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(l.conn, got); err != nil {
		return err
	}
	if string(got) != string(msg) {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

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
	m := startMesh(t)
	ctx := t.Context()
	root, err := m.cp.RootCert(ctx, IstioNamespace)
	if err != nil {
		t.Fatal(err)
	}
	load := startCallLoad(ctx, m.clients, m.dst)
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
		if synced, served := lineIndex(next.Log(), "xds: synced"), lineIndex(next.Log(), `proxy started	workload="demo/`); synced < 0 || served < synced {
			t.Fatalf("%s started a pod's proxy (line %d) before it synced istiod's xDS (line %d):\n%s", next.Name, served, synced, next.Log())
		}
		if n := logLinesWith(next.Log(), "received snapshot"); n != 1 {
			t.Fatalf("%s took %d ZDS snapshots, want 1:\n%s", next.Name, n, next.Log())
		}
		waitUntil(t, time.Minute, func() error { return holdsCerts(ctx, next.Pod, root, identities[i]) })

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
	ok, failed, errs := load.finish()
	t.Logf("rollout of both nodes' daemons under load: %d calls in %v, %d failed %q",
		ok+failed, time.Since(start).Round(100*time.Millisecond), failed, errs)
	if failed != 0 {
		t.Errorf("%d of %d calls failed during the rollouts", failed, ok+failed)
	}
}

// holdsCerts checks that the daemon in pod holds a certificate for each of
// ids, chaining to istiod's root.
func holdsCerts(ctx context.Context, pod *netnslab.Pod, root []byte, ids []string) error {
	certs, err := configDumpCerts(ctx, pod)
	if err != nil {
		return err
	}
	for _, id := range ids {
		c, err := certFor(certs, id, root)
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
	m := startMesh(t)
	ctx := t.Context()
	connected := m.xdsConnections
	before := make([]int, len(m.ztunnels))
	for i, z := range m.ztunnels {
		before[i] = connected(z)
		if before[i] == 0 {
			t.Fatalf("istiod logged no xDS connection of %s", z.Name)
		}
	}
	load := startCallLoad(ctx, m.clients, m.dst)
	start := time.Now()
	if err := m.cp.StopIstiod(); err != nil {
		t.Fatal(err)
	}
	t.Logf("istiod stopped in %v", time.Since(start).Round(time.Millisecond))
	// Each daemon saw its stream end; calls go on meanwhile.
	for _, z := range m.ztunnels {
		waitUntil(t, time.Minute, func() error {
			n, err := metricSum(ctx, z.Pod, "istio_xds_connection_terminations_total")
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
		t.Logf("%s reconnected: %s", z.Name, lastLineWith(z.Log(), "xds: stream"))
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

// metricSum adds the samples of a counter family on the daemon's metrics
// port (15020) in pod.
func metricSum(ctx context.Context, pod *netnslab.Pod, family string) (float64, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: pod.Dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:15020/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for line := range strings.Lines(string(data)) {
		if !strings.HasPrefix(line, family+"{") && !strings.HasPrefix(line, family+" ") {
			continue
		}
		f := strings.Fields(line)
		var v float64
		if _, err := fmt.Sscan(f[len(f)-1], &v); err != nil {
			return 0, fmt.Errorf("%s: %q: %w", family, line, err)
		}
		sum += v
	}
	return sum, nil
}

// certFor returns the leaf of id's certificate in a /config_dump, checked to
// chain to root; nil if there is none.
func certFor(certs []dumpCert, id string, root []byte) (*x509.Certificate, error) {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(root)
	for _, c := range certs {
		if c.Identity != id || len(c.CertChain) == 0 {
			continue
		}
		leaf, err := parseDumpCert(c.CertChain[0].PEM)
		if err != nil {
			return nil, err
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return nil, fmt.Errorf("certificate of %s does not chain to istiod's root: %w", id, err)
		}
		return leaf, nil
	}
	return nil, nil
}

// istiodBackdate is how far before the signing istiod dates a workload
// certificate's NotBefore (ClockSkewGracePeriod in its pki/util): the
// certificate is valid for the requested TTL plus this.
const istiodBackdate = 2 * time.Minute

// rotationTTL is the daemons' SECRET_TTL in TestCertRotation and
// TestRootRotation. The daemon, as ztunnel, renews at half the validity,
// NotBefore + (TTL+2m)/2, which with istiod's backdating is TTL/2 - 1m after
// issuance: 150 s renews 15 s after each issuance (a TTL of 2 min or less
// would be due for renewal as soon as issued).
const rotationTTL = 150 * time.Second

// TestCertRotation runs the daemons with short-lived workload certificates
// (SECRET_TTL, which they ask istiod's CA for in each CSR, as ztunnel does):
// istiod signs them for that lifetime, each daemon renews its pods'
// certificates before they expire (a new serial and a later NotAfter in
// /config_dump's certificates, under the same root), and calls between the
// pods keep passing across the renewals, through HBONE.
func TestCertRotation(t *testing.T) {
	m := startMesh(t, "SECRET_TTL="+rotationTTL.String())
	ctx := t.Context()
	root, err := m.cp.RootCert(ctx, IstioNamespace)
	if err != nil {
		t.Fatal(err)
	}
	// The server's certificate on node1, the far client's on node2.
	watch := []struct {
		z  *Ztunnel
		id string
	}{
		{m.ztunnels[0], "spiffe://cluster.local/ns/demo/sa/server"},
		{m.ztunnels[1], "spiffe://cluster.local/ns/demo/sa/client"},
	}
	first := make([]*x509.Certificate, len(watch))
	for i, w := range watch {
		waitUntil(t, time.Minute, func() error {
			certs, err := configDumpCerts(ctx, w.z.Pod)
			if err != nil {
				return err
			}
			first[i], err = certFor(certs, w.id, root)
			if err == nil && first[i] == nil {
				err = fmt.Errorf("%s holds no certificate for %s", w.z.Name, w.id)
			}
			return err
		})
		if got, want := first[i].NotAfter.Sub(first[i].NotBefore), rotationTTL+istiodBackdate; got < want-2*time.Second || got > want+2*time.Second {
			t.Fatalf("%s: istiod signed %s for %v (NotBefore %s, NotAfter %s), want SECRET_TTL + its %v backdating = %v",
				w.z.Name, w.id, got, first[i].NotBefore, first[i].NotAfter, istiodBackdate, want)
		}
	}
	load := startCallLoad(ctx, m.clients, m.dst)
	start := time.Now()
	for i, w := range watch {
		waitUntil(t, 2*time.Minute, func() error {
			certs, err := configDumpCerts(ctx, w.z.Pod)
			if err != nil {
				return err
			}
			cur, err := certFor(certs, w.id, root)
			if err != nil {
				return err
			}
			if cur == nil || cur.SerialNumber.Cmp(first[i].SerialNumber) == 0 {
				return fmt.Errorf("%s has not renewed %s (serial %s, NotAfter %s)", w.z.Name, w.id, first[i].SerialNumber, first[i].NotAfter)
			}
			if !cur.NotAfter.After(first[i].NotAfter) {
				return fmt.Errorf("%s renewed %s with NotAfter %s, not after the old one's %s", w.z.Name, w.id, cur.NotAfter, first[i].NotAfter)
			}
			t.Logf("%s renewed %s %v into the load: serial %s -> %s, NotAfter %s -> %s", w.z.Name, w.id,
				time.Since(start).Round(100*time.Millisecond), first[i].SerialNumber, cur.SerialNumber,
				first[i].NotAfter.Format(time.TimeOnly), cur.NotAfter.Format(time.TimeOnly))
			return nil
		})
	}
	// Calls go on through HBONE after the renewals.
	for _, c := range m.clients {
		m.waitHBONE(t, m.ztunnels[0], c)
	}
	ok, failed, errs := load.finish()
	t.Logf("certificate renewals under load: %d calls in %v, %d failed %q", ok+failed, time.Since(start).Round(100*time.Millisecond), failed, errs)
	if failed != 0 {
		t.Errorf("%d of %d calls failed across the renewals", failed, ok+failed)
	}
}

// TestRootRotation moves istiod from its self-signed CA to a plugged-in CA
// under a new root, as Istio's plugin-CA task does it without breaking
// traffic, under calls between the mesh's pods (the daemons' certificates
// short-lived, so they renew within seconds): first istiod is restarted
// with a cacerts Secret that still signs with the old root but trusts both
// (the trust bundle reaches the daemons with their renewed certificates,
// and the kubelet updates their mounted root file from the
// istio-ca-root-cert ConfigMap); then the Secret's signing certificate is
// replaced by an intermediate of the new root, which istiod loads by
// itself. Each daemon's pods' certificates end up chaining to the new root
// alone, the daemons reconnect to istiod (restarted) under the new root,
// and no call fails.
func TestRootRotation(t *testing.T) {
	m := startMesh(t, "SECRET_TTL="+rotationTTL.String())
	ctx := t.Context()
	oldRoot, err := m.cp.RootCert(ctx, IstioNamespace)
	if err != nil {
		t.Fatal(err)
	}
	// istiod's self-signed CA, from the Secret it keeps it in.
	secret := func(key string) []byte {
		out, err := m.cp.Kubectl(ctx, "", "get", "secret", "istio-ca-secret", "-n", IstioNamespace, "-o",
			"jsonpath={.data."+strings.ReplaceAll(key, ".", `\.`)+"}")
		if err != nil {
			t.Fatal(err)
		}
		data, err := base64.StdEncoding.DecodeString(string(out))
		if err != nil || len(data) == 0 {
			t.Fatalf("istio-ca-secret's %s: %q (%v)", key, out, err)
		}
		return data
	}
	oldCert, oldKey := secret("ca-cert.pem"), secret("ca-key.pem")
	newRoot, newRootKey := testCA(t, "istiolab root 2", nil, nil)
	inter, interKey := testCA(t, "istiolab intermediate 2", newRoot, newRootKey)
	bundle := slices.Concat(oldRoot, newRoot.pem)
	watch := []struct {
		z  *Ztunnel
		id string
	}{
		{m.ztunnels[0], "spiffe://cluster.local/ns/demo/sa/server"},
		{m.ztunnels[1], "spiffe://cluster.local/ns/demo/sa/client"},
	}
	load := startCallLoad(ctx, m.clients, m.dst)
	start := time.Now()

	// 1: trust both roots, sign with the old one.
	if err := m.cp.PlugCA(ctx, CACerts{CACert: oldCert, CAKey: oldKey, CertChain: oldCert, RootCert: bundle}); err != nil {
		t.Fatal(err)
	}
	if err := m.cp.StopIstiod(); err != nil {
		t.Fatal(err)
	}
	if err := m.cp.StartIstiod(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, func() error {
		root, err := m.cp.RootCert(ctx, IstioNamespace)
		if err != nil {
			return err
		}
		if !bytes.Contains(root, newRoot.pem) {
			return errors.New("istio-ca-root-cert does not hold the new root yet")
		}
		return nil
	})
	for _, z := range m.ztunnels {
		if err := m.cp.SyncZtunnelRoot(ctx, z); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range watch {
		waitUntil(t, 2*time.Minute, func() error {
			roots, leaf, err := dumpRoots(ctx, w.z.Pod, w.id)
			if err != nil {
				return err
			}
			if len(roots) != 2 {
				return fmt.Errorf("%s: %s's certificate comes with %d roots, want both", w.z.Name, w.id, len(roots))
			}
			if err := verifies(leaf, nil, oldRoot); err != nil {
				return fmt.Errorf("%s: %s: %w", w.z.Name, w.id, err)
			}
			return nil
		})
	}
	t.Logf("both roots trusted %v into the load", time.Since(start).Round(100*time.Millisecond))

	// 2: sign with an intermediate of the new root, loaded by istiod from
	// its updated files.
	if err := m.cp.PlugCA(ctx, CACerts{CACert: inter.pem, CAKey: interKey, CertChain: slices.Concat(inter.pem, newRoot.pem), RootCert: bundle}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, func() error {
		log, _ := os.ReadFile(m.cp.LogPath("istiod"))
		if !strings.Contains(string(log), "Istiod has detected the newly added intermediate CA") {
			return errors.New("istiod has not loaded the new intermediate")
		}
		return nil
	})
	for _, w := range watch {
		waitUntil(t, 2*time.Minute, func() error {
			_, leaf, err := dumpRoots(ctx, w.z.Pod, w.id)
			if err != nil {
				return err
			}
			if err := verifies(leaf, inter.pem, newRoot.pem); err != nil {
				return fmt.Errorf("%s: %s: not yet under the new root: %w", w.z.Name, w.id, err)
			}
			return nil
		})
	}
	t.Logf("pods' certificates under the new root %v into the load", time.Since(start).Round(100*time.Millisecond))
	// istiod restarted once more: each daemon's new xDS connection verifies
	// istiod's serving certificate, now under the new root, with the root
	// file the kubelet updated (which the daemon re-reads).
	connected := make([]int, len(m.ztunnels))
	for i, z := range m.ztunnels {
		connected[i] = m.xdsConnections(z)
	}
	if err := m.cp.StopIstiod(); err != nil {
		t.Fatal(err)
	}
	if err := m.cp.StartIstiod(ctx); err != nil {
		t.Fatal(err)
	}
	for i, z := range m.ztunnels {
		waitUntil(t, time.Minute, func() error {
			if m.xdsConnections(z) <= connected[i] {
				return fmt.Errorf("%s has not reconnected to istiod under the new root: %s", z.Name, lastLineWith(z.Log(), "xds:"))
			}
			return nil
		})
	}
	for _, c := range m.clients {
		m.waitHBONE(t, m.ztunnels[0], c)
	}
	ok, failed, errs := load.finish()
	t.Logf("root rotation under load: %d calls in %v, %d failed %q", ok+failed, time.Since(start).Round(100*time.Millisecond), failed, errs)
	if failed != 0 {
		t.Errorf("%d of %d calls failed across the root rotation", failed, ok+failed)
	}
}

// lineIndex returns the number of the first line of log holding part, or
// -1.
func lineIndex(log, part string) int {
	i := 0
	for line := range strings.Lines(log) {
		if strings.Contains(line, part) {
			return i
		}
		i++
	}
	return -1
}

// lastLineWith returns the last line of log holding part.
func lastLineWith(log, part string) string {
	var last string
	for line := range strings.Lines(log) {
		if strings.Contains(line, part) {
			last = strings.TrimSpace(line)
		}
	}
	return last
}

// testPEMCert is a test CA's certificate, parsed and PEM.
type testPEMCert struct {
	cert *x509.Certificate
	pem  []byte
}

// testCA makes a CA certificate for cn, signed by parent (self-signed if
// nil), and its key as PKCS#8 PEM.
func testCA(t *testing.T, cn string, parent *testPEMCert, parentKey []byte) (*testPEMCert, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{Organization: []string{"cluster.local"}, CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	signer, signerKey := tmpl, any(key)
	if parent != nil {
		block, _ := pem.Decode(parentKey)
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		signer, signerKey = parent.cert, k
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &testPEMCert{cert: cert, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// dumpRoots returns the roots and the leaf of id's certificate in the
// daemon's /config_dump in pod.
func dumpRoots(ctx context.Context, pod *netnslab.Pod, id string) ([]*x509.Certificate, *x509.Certificate, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: pod.Dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:15000/config_dump", nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	var dump struct {
		Certificates []struct {
			Identity  string                 `json:"identity"`
			CertChain []struct{ PEM string } `json:"certChain"`
			RootCerts []struct{ PEM string } `json:"rootCerts"`
		} `json:"certificates"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&dump); err != nil {
		return nil, nil, fmt.Errorf("config_dump: %w", err)
	}
	for _, c := range dump.Certificates {
		if c.Identity != id || len(c.CertChain) == 0 {
			continue
		}
		leaf, err := parseDumpCert(c.CertChain[0].PEM)
		if err != nil {
			return nil, nil, err
		}
		var roots []*x509.Certificate
		for _, r := range c.RootCerts {
			root, err := parseDumpCert(r.PEM)
			if err != nil {
				return nil, nil, err
			}
			roots = append(roots, root)
		}
		return roots, leaf, nil
	}
	return nil, nil, fmt.Errorf("no certificate for %s in /config_dump", id)
}

// verifies checks that leaf chains to root (PEM, the only root trusted)
// through inter (PEM, may be nil).
func verifies(leaf *x509.Certificate, inter, root []byte) error {
	roots, inters := x509.NewCertPool(), x509.NewCertPool()
	roots.AppendCertsFromPEM(root)
	inters.AppendCertsFromPEM(inter)
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}
