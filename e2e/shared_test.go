package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// sharedConfig is the mesh of the shared-mode tests: client and late on
// node-a, server on node-b, all HBONE. The server refuses peers without an
// mTLS identity, so reaching it proves the tunnel. late exists from the
// start but joins the mesh only when a test adds it.
const sharedConfig = `
workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.244.0.2"]
  protocol: HBONE
  node: node-a
  services: {}
- uid: cluster1//v1/Pod/default/late
  name: late
  namespace: default
  serviceAccount: late
  workloadIps: ["10.244.0.3"]
  protocol: HBONE
  node: node-a
  services: {}
- uid: cluster1//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  workloadIps: ["10.244.1.2"]
  protocol: HBONE
  node: node-b
  services: {}
  authorizationPolicies: ["default/strict-mtls"]
policies:
- name: strict-mtls
  namespace: default
  scope: WorkloadSelector
  action: Deny
  dryRun: false
  rules:
  - - - notPrincipals:
        - Presence: []
`

type sharedLab struct {
	c       *labrun.SharedCluster
	srvAddr netip.AddrPort
}

func startShared(t *testing.T, mods ...func(*labrun.SharedOptions)) *sharedLab {
	t.Helper()
	lab := netnslab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := labrun.SharedOptions{Binary: ztunnelBin, Dir: t.TempDir(), Later: []string{"late"}}
	for _, m := range mods {
		m(&opts)
	}
	c := startSharedCluster(ctx, t, lab, sharedConfig, opts)
	s := startEcho(t, c.Pods["server"], 8080)
	return &sharedLab{c: c, srvAddr: s.Addr}
}

// echoOnce opens a connection from pod to the server and checks one round
// trip; the caller closes it.
func (s *sharedLab) echoOnce(ctx context.Context, pod string) (net.Conn, error) {
	return s.echoFrom(ctx, s.c.Pods[pod])
}

func (s *sharedLab) echoFrom(ctx context.Context, pod *netnslab.Pod) (net.Conn, error) {
	return dialEcho(ctx, pod, s.srvAddr, "hello from "+pod.Name)
}

// workloadState fetches /config_dump's workloadState from d.
func workloadState(ctx context.Context, t *testing.T, d *labrun.Daemon) map[string]struct {
	Info  map[string]string `json:"info"`
	State string            `json:"state"`
} {
	t.Helper()
	code, body, err := d.Get(ctx, "http://127.0.0.1:15000/config_dump")
	if err != nil || code != 200 {
		t.Fatalf("config_dump: %d %v", code, err)
	}
	var dump struct {
		WorkloadState map[string]struct {
			Info  map[string]string `json:"info"`
			State string            `json:"state"`
		} `json:"workloadState"`
	}
	if err := json.Unmarshal(body, &dump); err != nil {
		t.Fatal(err)
	}
	return dump.WorkloadState
}

// connLoad opens back-to-back connections from a pod to the server with
// several workers and counts the attempts that failed.
type connLoad struct {
	ok, failed atomic.Int64
	stop       chan struct{}
	wg         sync.WaitGroup
	mu         sync.Mutex
	errs       []string

	// Stall diagnosis: when an attempt has taken longer than stallAfter,
	// onStall runs once (the upgrade tests dump the live daemons'
	// goroutines there, while the stall lasts).
	started   []atomic.Int64 // per worker: unix nanoseconds its attempt began, 0 between
	onStall   func()
	stallOnce sync.Once
}

// stallAfter is how long an echo through the lab may take before the
// load calls it a stall (they take milliseconds).
const stallAfter = time.Second

func startConnLoad(ctx context.Context, s *sharedLab, podName string, workers int) *connLoad {
	return startConnLoadWith(ctx, s, podName, workers, 0, nil)
}

// startConnLoadWatched is startConnLoad with onStall called once if an
// attempt stalls.
func startConnLoadWatched(ctx context.Context, s *sharedLab, podName string, workers int, onStall func()) *connLoad {
	return startConnLoadWith(ctx, s, podName, workers, 0, onStall)
}

// startConnLoadPaced is startConnLoad with each worker starting an attempt
// every interval, as Istio's traffic generator calls at a fixed rate: its
// success ratios weigh a period by its length, where back-to-back attempts
// would weigh instant refusals many times over calls that take a round trip.
func startConnLoadPaced(ctx context.Context, s *sharedLab, podName string, workers int, interval time.Duration) *connLoad {
	return startConnLoadWith(ctx, s, podName, workers, interval, nil)
}

func startConnLoadWith(ctx context.Context, s *sharedLab, podName string, workers int, interval time.Duration, onStall func()) *connLoad {
	l := &connLoad{stop: make(chan struct{}), started: make([]atomic.Int64, workers), onStall: onStall}
	pod := s.c.Pods[podName] // read once: the cluster's maps are not for concurrent use
	if onStall != nil {
		l.wg.Go(l.watch)
	}
	for w := range workers {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				begin := time.Now()
				l.started[w].Store(begin.UnixNano())
				c, err := s.echoFrom(ctx, pod)
				l.started[w].Store(0)
				if interval > 0 {
					select {
					case <-l.stop:
					case <-time.After(time.Until(begin.Add(interval))):
					}
				}
				if err != nil {
					l.failed.Add(1)
					l.mu.Lock()
					if len(l.errs) < 5 {
						l.errs = append(l.errs, err.Error())
					}
					l.mu.Unlock()
					continue
				}
				c.Close()
				l.ok.Add(1)
			}
		})
	}
	return l
}

// watch calls onStall once when an attempt has run longer than stallAfter.
func (l *connLoad) watch() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		for i := range l.started {
			if st := l.started[i].Load(); st != 0 && time.Duration(now-st) > stallAfter {
				l.stallOnce.Do(l.onStall)
				return
			}
		}
	}
}

// await waits until the load has made n more connection attempts, so each
// phase of a test under load covers that many however slow the machine:
// a phase timed by a sleep held a handful of attempts on a loaded CI
// machine and hundreds on an idle one.
func (l *connLoad) await(t testing.TB, n int64) {
	t.Helper()
	attempts := func() int64 { return l.ok.Load() + l.failed.Load() }
	target := attempts() + n
	if !nettest.Until(time.Minute, func() bool { return attempts() >= target }) {
		t.Fatalf("the load made %d of %d connection attempts in a minute", attempts()-target+n, n)
	}
}

func (l *connLoad) finish() (ok, failed int64, errs []string) {
	close(l.stop)
	l.wg.Wait()
	return l.ok.Load(), l.failed.Load(), l.errs
}

// TestSharedMode runs one daemon per node in shared mode, fed by a fake CNI
// agent per node: pods on two nodes talk through HBONE; a pod added while
// traffic flows is captured; a deleted pod's listeners are gone and its
// connections closed; the agent and the daemon restart and service resumes;
// a malformed request is Nacked while the pods keep being served.
func TestSharedMode(t *testing.T) {
	s := startShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := s.c

	long, err := s.echoOnce(ctx, "client")
	if err != nil {
		t.Fatalf("client -> server through HBONE: %v", err)
	}
	defer long.Close()
	// Not through the mesh (from the node itself): STRICT refuses it.
	if nc, err := c.Lab.Nodes()[0].Dial(ctx, "tcp", s.srvAddr.String()); err == nil {
		if got, err := roundTrip(nc.(*net.TCPConn), []byte("plain")); err == nil && string(got) == "plain" {
			t.Fatal("a plaintext connection from outside the mesh reached the STRICT server")
		}
		nc.Close()
	}
	ws := workloadState(ctx, t, c.Daemons["node-a"])
	if st := ws[c.UID("client")]; st.State != "Up" || st.Info["name"] != "client" || st.Info["serviceAccount"] != "client" {
		t.Fatalf("node-a workloadState %+v, want client Up", ws)
	}

	t.Run("pod added while traffic flows", func(t *testing.T) {
		// late is in its netns already, but not meshed: no capture, and
		// the STRICT server refuses its plaintext.
		if _, err := s.echoOnce(ctx, "late"); err == nil {
			t.Fatal("late reached the STRICT server before joining the mesh")
		}
		load := startConnLoad(ctx, s, "client", 4)
		load.await(t, 20)
		if err := c.AddToMesh("late"); err != nil {
			t.Fatal(err)
		}
		lc, err := s.echoOnce(ctx, "late")
		if err != nil {
			t.Fatalf("late -> server once meshed: %v", err)
		}
		lc.Close()
		load.await(t, 20)
		ok, failed, errs := load.finish()
		t.Logf("adding a pod under load: %d connections, %d failed", ok+failed, failed)
		if failed != 0 || ok == 0 {
			t.Fatalf("load while adding a pod: %d ok, %d failed: %q", ok, failed, errs)
		}
	})

	t.Run("pod deleted", func(t *testing.T) {
		lc, err := s.echoOnce(ctx, "late")
		if err != nil {
			t.Fatal(err)
		}
		defer lc.Close()
		if err := c.RemoveFromMesh("late"); err != nil {
			t.Fatal(err)
		}
		lc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := lc.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("the deleted pod's connection stayed open")
		}
		for _, port := range []int{15001, 15006, 15008} {
			if !eventually(10*time.Second, 20*time.Millisecond, func() bool {
				pc, err := c.Pods["late"].Dial(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
				if pc != nil {
					pc.Close()
				}
				return err != nil && errors.Is(err, syscall.ECONNREFUSED)
			}) {
				t.Fatalf("the deleted pod still listens on %d", port)
			}
		}
		if _, ok := workloadState(ctx, t, c.Daemons["node-a"])[c.UID("late")]; ok {
			t.Fatal("the deleted pod is still in workloadState")
		}
		if err := nettest.RoundTrip(long, "others unaffected"); err != nil {
			t.Fatalf("client's connection after late's deletion: %v", err)
		}
	})

	t.Run("malformed request", func(t *testing.T) {
		agent := c.Agents["node-a"]
		before := agent.Snapshots()
		ack, err := agent.SendRaw([]byte{0xff, 0xff, 0xff})
		if err != nil {
			t.Fatal(err)
		}
		if ack == "" {
			t.Fatal("a malformed request was Acked")
		}
		// The daemon reconnects and takes a new snapshot; the pods were
		// served all along. (Waiting for the snapshot, not the connection:
		// the next subtest cut a connection counted but not yet synced, and
		// then waited for a snapshot count it could not reach.)
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		if err := agent.WaitSnapshots(wctx, before+1); err != nil {
			t.Fatalf("the daemon did not reconnect and sync after its Nack: %v", err)
		}
		if err := nettest.RoundTrip(long, "after the nack"); err != nil {
			t.Fatalf("long-lived connection after a malformed request: %v", err)
		}
	})

	t.Run("agent restart", func(t *testing.T) {
		agent := c.Agents["node-a"]
		before := agent.Snapshots()
		agent.CloseConns()
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		if err := agent.WaitSnapshots(wctx, before+1); err != nil {
			t.Fatal(err)
		}
		if err := nettest.RoundTrip(long, "after the agent restart"); err != nil {
			t.Fatalf("long-lived connection across the agent restart: %v", err)
		}
		nc, err := s.echoOnce(ctx, "client")
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
	})

	t.Run("daemon restart", func(t *testing.T) {
		if err := c.StopDaemon(c.Daemons["node-b"]); err != nil {
			t.Fatalf("daemon exit: %v", err)
		}
		if _, err := s.echoOnce(ctx, "client"); err == nil {
			t.Fatal("client reached the server with node-b's daemon stopped")
		}
		if _, err := c.StartDaemon(ctx, "node-b"); err != nil {
			t.Fatal(err)
		}
		nc, err := s.echoOnce(ctx, "client")
		if err != nil {
			t.Fatalf("client -> server after node-b's daemon restarted: %v", err)
		}
		nc.Close()
	})

	if n := c.Agents["node-a"].Nacks(); len(n) != 1 || n[0].Request != "raw" {
		t.Errorf("node-a Nacks %+v, want only the malformed request's", n)
	}
	if n := c.Agents["node-b"].Nacks(); len(n) != 0 {
		t.Errorf("node-b Nacks %+v, want none", n)
	}
}

// TestSharedProtocolErrorExits checks ztunnel's contract: a request that
// breaks the ZDS protocol (Keep after the snapshot) is Nacked and the daemon
// exits 1.
func TestSharedProtocolErrorExits(t *testing.T) {
	s := startShared(t)
	d := s.c.Daemons["node-a"]
	ack, err := s.c.Agents["node-a"].Keep(s.c.UID("client"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ack, "protocol") {
		t.Fatalf("Keep after the snapshot: response %q, want a protocol Nack", ack)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = d.Wait(ctx)
	var ee interface{ ExitCode() int }
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("daemon exit %v, want status 1", err)
	}
	s.c.StopDaemon(d) // already exited: only marks it
}

// TestSharedUpgrade starts a second daemon on each node in turn while
// connections are opened back to back, lets it take over the pods'
// listeners through SO_REUSEPORT, then drains the old one; it counts the
// connection attempts lost during the switches: none may be.
func TestSharedUpgrade(t *testing.T) {
	s := startShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	long, err := s.echoOnce(ctx, "client")
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	stalls := newStallDump(ctx, s.c)
	load := startConnLoadWatched(ctx, s, "client", 8, stalls.dump)
	start := time.Now()
	for _, node := range []string{"node-a", "node-b"} {
		old := s.c.Daemons[node]
		next, err := s.c.StartDaemon(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		stalls.started(next)
		load.await(t, 100) // both serve
		if err := s.c.StopDaemon(old); err != nil {
			t.Fatalf("old daemon on %s: %v", node, err)
		}
		stalls.stopped(old)
		load.await(t, 100) // the new one alone
	}
	ok, failed, errs := load.finish()
	t.Logf("upgrade of both nodes' daemons under load: %d connection attempts in %v, %d failed %q",
		ok+failed, time.Since(start).Round(time.Millisecond), failed, errs)
	if failed != 0 {
		t.Errorf("%d of %d new connections lost during the upgrades", failed, ok+failed)
	}
	if d := stalls.String(); d != "" && t.Failed() {
		t.Log(d)
	}
	// A connection that lived through the old daemons was closed by their
	// drain deadline (ztunnel behaves the same): show it.
	if err := nettest.RoundTrip(long, "x"); err == nil {
		t.Log("the long-lived connection survived both upgrades")
	} else {
		t.Logf("the long-lived connection ended with the old daemons' drain (as in ztunnel): %v", err)
	}
}

// procStat reads a process's resident memory, descriptors and threads.
func procStat(b testing.TB, pid int) (rss uint64, fds, threads int) {
	b.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		b.Fatal(err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		if f := strings.Fields(v); len(f) > 0 {
			n, _ := strconv.ParseUint(f[0], 10, 64)
			switch k {
			case "VmRSS":
				rss = n << 10
			case "Threads":
				threads = int(n)
			}
		}
	}
	return rss, len(ents), threads
}

// BenchmarkSharedPods100 measures the daemon binary in shared mode with 100
// pods on its node: the time to add them one by one (the CNI path: Add,
// proxy up, Ack), the
// time a restarted daemon takes to be ready with all of them in its
// snapshot, and the resident memory, descriptors and threads each pod adds.
// Run with -benchtime=1x (root).
func BenchmarkSharedPods100(b *testing.B) {
	const pods = 100
	var cfg strings.Builder
	cfg.WriteString("workloads:\n")
	var names []string
	for i := range pods {
		name := fmt.Sprintf("pod-%03d", i)
		names = append(names, name)
		fmt.Fprintf(&cfg, "- uid: uid-%s\n  name: %s\n  namespace: default\n  serviceAccount: sa-%d\n  workloadIps: [\"10.244.0.%d\"]\n  protocol: HBONE\n  node: node-a\n  services: {}\n", name, name, i%10, i+2)
	}
	lab := netnslab.New(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := labrun.StartSharedCluster(ctx, lab, []byte(cfg.String()), labrun.SharedOptions{
		Binary: ztunnelBin, Dir: b.TempDir(), Later: names, LogLevel: "warn",
	})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for b.Loop() {
		d := c.Daemons["node-a"]
		time.Sleep(200 * time.Millisecond) // let the idle daemon settle
		rss0, fds0, thr0 := procStat(b, d.PID())
		for _, n := range names {
			// The CNI's iptables-restore (a few ms a pod) is not the
			// daemon's cost: install the rules first, time the Adds.
			if err := c.Pods[n].InstallCapture(); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		for _, n := range names {
			if err := c.AddToMesh(n); err != nil {
				b.Fatal(err)
			}
		}
		meshAll := time.Since(start)
		time.Sleep(200 * time.Millisecond)
		rss1, fds1, thr1 := procStat(b, d.PID())

		if err := c.StopDaemon(d); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		if _, err := c.StartDaemon(ctx, "node-a"); err != nil {
			b.Fatal(err)
		}
		restartReady := time.Since(start)

		b.ReportMetric(float64(meshAll.Microseconds())/pods, "µs/add")
		b.ReportMetric(float64(restartReady.Milliseconds()), "ms-restart-to-ready")
		b.ReportMetric(float64(int64(rss1)-int64(rss0))/pods, "rss-B/pod")
		b.ReportMetric(float64(fds1-fds0)/pods, "fds/pod")
		b.ReportMetric(float64(thr1-thr0), "threads-added")
		b.Logf("daemon with 0 pods: rss %d KiB, %d fds, %d threads; with %d: rss %d KiB, %d fds, %d threads",
			rss0>>10, fds0, thr0, pods, rss1>>10, fds1, thr1)
	}
}

// stallDump keeps the live daemons of an upgrade test so that a stalled
// connection (connLoad's onStall, on the load's goroutine) can dump their
// goroutines while the stall lasts; the test prints it if it fails.
type stallDump struct {
	ctx  context.Context
	mu   sync.Mutex // guards the following fields
	live []*labrun.Daemon
	out  strings.Builder
}

func newStallDump(ctx context.Context, c *labrun.SharedCluster) *stallDump {
	return &stallDump{ctx: ctx, live: c.AllDaemons()}
}

// started and stopped follow the test's daemon changes.
func (d *stallDump) started(x *labrun.Daemon) {
	d.mu.Lock()
	d.live = append(d.live, x)
	d.mu.Unlock()
}

func (d *stallDump) stopped(x *labrun.Daemon) {
	d.mu.Lock()
	d.live = slices.DeleteFunc(d.live, func(y *labrun.Daemon) bool { return y == x })
	d.mu.Unlock()
}

// dump fetches every live daemon's goroutines from its admin server.
func (d *stallDump) dump() {
	d.mu.Lock()
	live := slices.Clone(d.live)
	d.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "a connection stalled over %v at %s; goroutines of the live daemons:\n", stallAfter, time.Now().UTC().Format("15:04:05.000"))
	for _, x := range live {
		ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
		code, body, err := x.Get(ctx, "http://127.0.0.1:15000/debug/pprof/goroutine?debug=2")
		cancel()
		fmt.Fprintf(&b, "==== %s: %d %v\n%s\n", x.Pod.Name, code, err, body)
	}
	d.mu.Lock()
	d.out.WriteString(b.String())
	d.mu.Unlock()
}

func (d *stallDump) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}
