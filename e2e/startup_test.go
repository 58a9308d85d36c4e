package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// startupConfig is the topology of the start-up tests: the node "cp" is made
// first (it hosts the fake istiods), so node-a's pods are 10.244.1.x and
// node-b's 10.244.2.x. The file holds workloads only: the one policy comes
// from xDS, which is what a daemon must wait for.
const startupConfig = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.2.2"], protocol: HBONE, node: node-b, services: {}}
`

// denyClient is the policy under test: the server's namespace refuses the
// client's identity.
var denyClient = &securityapi.Authorization{
	Name: "deny-client", Namespace: "default", Scope: securityapi.Scope_NAMESPACE, Action: securityapi.Action_DENY,
	Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{
		Principals: []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Exact{Exact: "cluster.local/ns/default/sa/client"}}},
	}}}}}},
}

// fakeIstiod is an xDS server inside the lab's cp node, which can be
// taken down and brought up again on its address.
type fakeIstiod struct {
	*xdstest.Server
	node *netnslab.Node
	addr string
}

func newFakeIstiod(t *testing.T, cp *netnslab.Node, port int) *fakeIstiod {
	t.Helper()
	addr := fmt.Sprintf("%s:%d", cp.IP, port)
	ln, err := cp.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := xdstest.NewServer(t, xdstest.Options{Listener: ln, ServerNames: []string{"istiod.istio-system.svc", cp.IP.String()}})
	return &fakeIstiod{Server: srv, node: cp, addr: addr}
}

// env points a daemon at this server (and nowhere else for xDS).
func (f *fakeIstiod) env() []string {
	return []string{"XDS_ADDRESS=" + f.Address(), "XDS_ROOT_CA=" + f.TLS().RootFile}
}

func (f *fakeIstiod) up(t *testing.T) {
	t.Helper()
	ln, err := f.node.Listen("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	f.Up(ln)
}

// admissionProbe opens connections from a pod to the echo server back to
// back, each checked with one round trip, and records when one got through.
type admissionProbe struct {
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	attempts atomic.Int64
	mu       sync.Mutex
	admitted []time.Time
}

func startAdmissionProbe(ctx context.Context, pod *netnslab.Pod, target string) *admissionProbe {
	ctx, cancel := context.WithCancel(ctx)
	p := &admissionProbe{cancel: cancel}
	p.wg.Go(func() {
		// Bounded by ctx (the test's deadline) and by a count.
		for i := 0; i < 100000 && ctx.Err() == nil; i++ {
			p.attempts.Add(1)
			dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := pod.Dial(dctx, "tcp", target)
			dcancel()
			if err == nil {
				if nettest.RoundTrip(c, "probe") == nil {
					p.mu.Lock()
					p.admitted = append(p.admitted, time.Now())
					p.mu.Unlock()
				}
				c.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	return p
}

// await waits until the probe has made n more attempts: each window of the
// start-up under watch covers that many, however slow the machine.
func (p *admissionProbe) await(t testing.TB, n int64) {
	t.Helper()
	target := p.attempts.Load() + n
	if !nettest.Until(2*time.Minute, func() bool { return p.attempts.Load() >= target }) {
		t.Fatalf("the probe made %d of %d attempts in two minutes", p.attempts.Load()-target+n, n)
	}
}

// admittedSince returns how many connections got through since t.
func (p *admissionProbe) admittedSince(t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, at := range p.admitted {
		if !at.Before(t) {
			n++
		}
	}
	return n
}

func (p *admissionProbe) stop() {
	p.cancel()
	p.wg.Wait()
}

// waitAdmitted waits until a connection has got through since t.
func (p *admissionProbe) waitAdmitted(ctx context.Context, t time.Time) bool {
	for p.admittedSince(t) == 0 {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	return true
}

// notReady fails the test if d reports ready.
func notReady(ctx context.Context, t *testing.T, d *labrun.Daemon, when string) {
	t.Helper()
	code, body, err := d.Get(ctx, "http://localhost:15021/healthz/ready")
	if err == nil && code == 200 {
		t.Errorf("%s: daemon %s ready before its state synced: %s", when, d.Pod.Name, body)
	}
}

// TestStartupServesNothingBeforeSync restarts the daemons of both nodes
// again and again against an istiod that is down at first, then answers
// Address but withholds Authorization, then sends a DENY for the client.
// Connections from the client to the server are attempted back to back
// through all of it: not one may get through before the policy is removed
// at the very end (which proves the probe can see an admission). Before the
// sync no daemon may be ready, connect to its CNI agent or open a pod
// listener.
func TestStartupServesNothingBeforeSync(t *testing.T) {
	lab := netnslab.New(t)
	cp, err := lab.AddNode("cp")
	if err != nil {
		t.Fatal(err)
	}
	istiod := newFakeIstiod(t, cp, 15012)
	istiod.Set(xdsconv.AuthorizationType, "default/deny-client", "1", denyClient)
	istiod.Down()
	istiod.Withhold(xdsconv.AuthorizationType)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startSharedCluster(ctx, t, lab, startupConfig, labrun.SharedOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), DaemonEnv: istiod.env(), NoWait: true,
	})
	echo := startEcho(t, c.Pods["server"], 8080)
	probe := startAdmissionProbe(ctx, c.Pods["client"], echo.Addr.String())
	defer probe.stop()
	begin := time.Now()

	rounds := 3
	if os.Getenv(soakEnv) == "1" { // make soak: many more restarts
		rounds = 25
	}
	for round := 0; round < rounds; round++ {
		if round > 0 {
			// A restart of both daemons against an istiod that is down,
			// then slow to send the policies.
			istiod.Down()
			istiod.Withhold(xdsconv.AuthorizationType)
			for _, node := range []string{"node-a", "node-b"} {
				old := c.Daemons[node]
				if err := c.StopDaemon(old); err != nil {
					t.Fatalf("round %d: stopping %s: %v", round, old.Pod.Name, err)
				}
				if _, err := c.StartDaemonWith(ctx, node, labrun.DaemonStart{NoWait: true}); err != nil {
					t.Fatal(err)
				}
			}
		}
		agentConns := map[string]int{}
		for node, a := range c.Agents {
			agentConns[node] = a.Connections()
		}
		probe.await(t, 20) // istiod down: the daemons retry
		istiod.up(t)
		// Both daemons asked for Authorization and got no answer yet.
		var asked sync.Map
		for n := 0; n < 2; {
			r := istiod.WaitRequest(func(r *xdstest.Request) bool {
				_, seen := asked.Load(r.Stream)
				return r.TypeUrl == xdsconv.AuthorizationType && r.ResponseNonce == "" && !seen
			})
			asked.Store(r.Stream, true)
			n++
		}
		probe.await(t, 20) // Address synced, Authorization not
		for node, d := range c.Daemons {
			notReady(ctx, t, d, fmt.Sprintf("round %d", round))
			if got := c.Agents[node].Connections(); got != agentConns[node] {
				t.Errorf("round %d: daemon %s connected to its CNI agent before its state synced", round, d.Pod.Name)
			}
		}
		istiod.Release(xdsconv.AuthorizationType)
		for _, d := range c.Daemons {
			if err := d.WaitReady(ctx, 30*time.Second); err != nil {
				t.Fatalf("round %d: daemon %s not ready after the sync: %v", round, d.Pod.Name, err)
			}
		}
		probe.await(t, 15) // serving, with the DENY
		if n := probe.admittedSince(begin); n != 0 {
			t.Fatalf("round %d: %d connections the DENY refuses were admitted during start-up", round, n)
		}
	}

	// The probe's connections reached the policy decision on the server's
	// node (so "none admitted" is no artefact of a probe that never arrives).
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if _, err := c.Daemons["node-b"].WaitLog(wctx, `src.identity="spiffe://cluster.local/ns/default/sa/client"`,
		"connection closed due to policy rejection: explicitly denied by: default/deny-client"); err != nil {
		t.Fatalf("the probe's connections never reached the server's policy check: %v", err)
	}
	var slow *fakeIstiod
	{
		// The upgrade: a second daemon on the server's node whose istiod is up
		// but withholds Authorization must take no share of the pod's
		// listeners (SO_REUSEPORT) while the synced one keeps enforcing.
		slow = newFakeIstiod(t, cp, 15014)
		slow.Set(xdsconv.AuthorizationType, "default/deny-client", "1", denyClient)
		slow.Withhold(xdsconv.AuthorizationType)
		before := c.Agents["node-b"].Connections()
		old := c.Daemons["node-b"]
		next, err := c.StartDaemonWith(ctx, "node-b", labrun.DaemonStart{Env: slow.env(), NoWait: true})
		if err != nil {
			t.Fatal(err)
		}
		slow.WaitRequest(func(r *xdstest.Request) bool { return r.TypeUrl == xdsconv.AuthorizationType })
		probe.await(t, 40) // both run; only the old one is synced
		notReady(ctx, t, next, "upgrade")
		if got := c.Agents["node-b"].Connections(); got != before {
			t.Errorf("upgrade: the new daemon connected to its CNI agent before its state synced")
		}
		slow.Release(xdsconv.AuthorizationType)
		if err := next.WaitReady(ctx, 30*time.Second); err != nil {
			t.Fatalf("upgrade: new daemon not ready after the sync: %v", err)
		}
		probe.await(t, 15) // both serve
		if err := c.StopDaemon(old); err != nil {
			t.Fatalf("upgrade: old daemon: %v", err)
		}
		probe.await(t, 15) // the new one alone
		if n := probe.admittedSince(begin); n != 0 {
			t.Fatalf("upgrade: %d connections the DENY refuses were admitted", n)
		}
	}

	// The probe sees an admission as soon as the policy goes.
	removed := time.Now()
	istiod.Remove(xdsconv.AuthorizationType, "default/deny-client")
	slow.Remove(xdsconv.AuthorizationType, "default/deny-client")
	actx, acancel := context.WithTimeout(ctx, 30*time.Second)
	defer acancel()
	if !probe.waitAdmitted(actx, removed) {
		t.Fatal("no connection got through after the DENY was removed: the probe cannot tell admission")
	}
	t.Logf("%d connection attempts over %d restarts and one upgrade; none admitted while the DENY stood",
		probe.attempts.Load(), rounds)
}

// TestDedicatedServesNothingBeforeSync: a dedicated-mode daemon whose
// istiod withholds Authorization opens none of its listeners (15001, 15006,
// 15008, DNS on 15053) and is not ready; once the policies arrive it opens
// them all and is ready.
func TestDedicatedServesNothingBeforeSync(t *testing.T) {
	lab := netnslab.New(t)
	cp, err := lab.AddNode("cp")
	if err != nil {
		t.Fatal(err)
	}
	istiod := newFakeIstiod(t, cp, 15012)
	istiod.Set(xdsconv.AuthorizationType, "default/deny-client", "1", denyClient)
	istiod.Withhold(xdsconv.AuthorizationType)
	pod, cfgPath, caCert, caKey := oneDedicatedPod(t, lab, startupConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := labrun.StartDaemon(ctx, pod, labrun.DaemonOptions{
		Binary: ztunnelBin, ConfigPath: cfgPath, CACert: caCert, CAKey: caKey,
		Workload: "default/client/client", Env: istiod.env(), NoWait: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.Log())
		}
	})
	ports := []string{"[::1]:15001", "[::1]:15006", "[::1]:15008", "127.0.0.1:15053"}
	listening := func() (open []string) {
		for _, addr := range ports {
			dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := pod.Dial(dctx, "tcp", addr)
			dcancel()
			if err == nil {
				c.Close()
			}
			// A listener that accepts and resets at once (a self call)
			// can fail the dial too: only a refusal means no listener.
			if !errors.Is(err, syscall.ECONNREFUSED) {
				open = append(open, addr)
			}
		}
		return open
	}
	istiod.WaitRequest(func(r *xdstest.Request) bool { return r.TypeUrl == xdsconv.AuthorizationType })
	for i := 0; i < 5; i++ {
		if open := listening(); len(open) != 0 {
			t.Fatalf("listening on %v before Authorization synced", open)
		}
		notReady(ctx, t, d, "dedicated")
		time.Sleep(100 * time.Millisecond)
	}
	istiod.Release(xdsconv.AuthorizationType)
	if err := d.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatalf("not ready after the sync: %v", err)
	}
	if open := listening(); len(open) != len(ports) {
		t.Fatalf("after the sync listening on %v, want all of %v", open, ports)
	}
}
