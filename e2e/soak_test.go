package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// soakEnv selects the long variant of TestLoad (make soak).
const soakEnv = "ZTUNNEL_SOAK"

// echoHelperEnv makes the test binary an echo server on the address it
// holds (see runEchoHelper): the load's server side runs in a process of its
// own, so that neither it nor the test process needs descriptors for both
// ends of every connection.
const echoHelperEnv = "ZTUNNEL_E2E_ECHO_HELPER"

// runEchoHelper echoes every connection on addr until its stdin closes (its
// parent is gone or done). It prints "ready" once listening.
func runEchoHelper(addr string) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	fmt.Println("ready")
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return 0
			}
			// EMFILE and friends: wait for descriptors to come back.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go func() {
			defer c.Close()
			// A small buffer, and no splice: io.Copy between sockets would
			// hold a pipe (two more descriptors) per blocked connection.
			buf := make([]byte, 4096)
			if _, err := io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, buf); err == nil {
				c.(*net.TCPConn).CloseWrite()
				io.Copy(io.Discard, c)
			}
		}()
	}
}

// startEchoProcess runs the echo helper in pod on port and stops it when
// the test ends.
func startEchoProcess(t *testing.T, pod *netnslab.Pod, port uint16) netip.AddrPort {
	t.Helper()
	cmd := pod.Command(context.Background(), os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=0.0.0.0:%d", echoHelperEnv, port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("echo helper in %s: %q %v", pod.Name, line, err)
	}
	return netip.AddrPortFrom(pod.IP, port)
}

// loadConfig is the node pair of the load test. The node "cp" (the fake
// istiod, which pushes the policies) is made first, so node-a's pods are
// 10.244.1.x and node-b's 10.244.2.x.
const loadConfig = `
workloads:
- {uid: u-long, name: long, namespace: default, serviceAccount: long, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-storm, name: storm, namespace: default, serviceAccount: storm, workloadIps: ["10.244.1.3"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.2.2"], protocol: HBONE, node: node-b, services: {}}
`

// loadPlan sizes a run of TestLoad.
type loadPlan struct {
	name      string
	conns     int           // long-lived connections held at once
	stormRate int           // short connections per second asked for
	stormFor  time.Duration // how long the storm (and the policy pushes) last
	workers   int           // storm connections in flight at most
}

var (
	fastLoad = loadPlan{name: "fast", conns: 500, stormRate: 200, stormFor: 5 * time.Second, workers: 16}
	soakLoad = loadPlan{name: "soak", conns: 10000, stormRate: 1000, stormFor: 60 * time.Second, workers: 64}
)

// longConn is one long-lived connection whose every byte is checked: each
// round's echo must equal what was sent, and the running SHA-256 of all
// sent and all received must agree when it closes.
type longConn struct {
	c          *net.TCPConn
	rnd        *rand.ChaCha8
	sent, recv hash.Hash
	bytes      int64
}

func (lc *longConn) round(buf, got []byte) error {
	lc.rnd.Read(buf)
	lc.c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := lc.c.Write(buf); err != nil {
		return err
	}
	if _, err := io.ReadFull(lc.c, got); err != nil {
		return err
	}
	lc.sent.Write(buf)
	lc.recv.Write(got)
	lc.bytes += int64(len(buf))
	if !bytes.Equal(buf, got) {
		return errors.New("echo differs from what was sent")
	}
	return nil
}

// finish half-closes, expects a clean EOF, and compares the checksums.
func (lc *longConn) finish() error {
	defer lc.c.Close()
	if err := lc.c.CloseWrite(); err != nil {
		return err
	}
	rest, err := io.ReadAll(lc.c)
	if err != nil {
		return err
	}
	lc.recv.Write(rest)
	if len(rest) != 0 || !bytes.Equal(lc.sent.Sum(nil), lc.recv.Sum(nil)) {
		return fmt.Errorf("checksums differ after %d bytes (%d unexpected at the end)", lc.bytes, len(rest))
	}
	return nil
}

// errLog keeps the first few errors of many workers.
type errLog struct {
	n    atomic.Int64
	mu   sync.Mutex
	errs []string
}

func (e *errLog) add(err error) {
	e.n.Add(1)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.errs) < 5 {
		e.errs = append(e.errs, err.Error())
	}
}

func (e *errLog) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return fmt.Sprintf("%d errors, first: %q", e.n.Load(), e.errs)
}

// raiseNoFile lifts this process's soft descriptor limit to need, or fails
// with what to do when the hard limit is lower (raising that takes
// CAP_SYS_RESOURCE). Processes started afterwards inherit it.
func raiseNoFile(t *testing.T, need uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= need {
		return
	}
	want := syscall.Rlimit{Cur: need, Max: max(need, rl.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		t.Fatalf("RLIMIT_NOFILE is %d (hard %d) and %d are needed: %v (run as root with CAP_SYS_RESOURCE, or ulimit -n %d)",
			rl.Cur, rl.Max, need, err, need)
	}
}

// setPodSysctls lets a pod open many short connections: the whole port
// range, and reuse of ports in TIME_WAIT.
func setPodSysctls(t *testing.T, pod *netnslab.Pod) {
	t.Helper()
	err := pod.Do(func() error {
		for k, v := range map[string]string{
			"/proc/sys/net/ipv4/ip_local_port_range": "1024 65000",
			"/proc/sys/net/ipv4/tcp_tw_reuse":        "1",
		} {
			if err := os.WriteFile(k, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLoad drives a node pair (one shared-mode daemon per node, pods on
// both, HBONE between them) with long-lived connections whose every byte is
// checked, a storm of short connections at a bounded rate, and a policy
// pushed over xDS every second; it samples the daemons' memory,
// descriptors and goroutines before, at the peak and after, and requires
// descriptors and goroutines to come back near their baseline. `make test`
// runs the fast variant; ZTUNNEL_SOAK=1 (make soak) the long one.
func TestLoad(t *testing.T) {
	plan := fastLoad
	if os.Getenv(soakEnv) != "" {
		plan = soakLoad
	}
	raiseNoFile(t, uint64(plan.conns+4*plan.workers+1024))
	lab := netnslab.New(t)
	cp, err := lab.AddNode("cp")
	if err != nil {
		t.Fatal(err)
	}
	xdsLn, err := cp.Listen("tcp", cp.IP.String()+":15012")
	if err != nil {
		t.Fatal(err)
	}
	xds := xdstest.NewServer(t, xdstest.Options{Listener: xdsLn, ServerNames: []string{cp.IP.String()}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, err := labrun.StartSharedCluster(ctx, lab, []byte(loadConfig), labrun.SharedOptions{
		Binary: ztunnelBin, Dir: t.TempDir(), LogLevel: "warn",
		DaemonEnv: []string{
			// Workloads from the file, policies from istiod.
			"XDS_ADDRESS=" + xds.Address(), "XDS_ROOT_CA=" + xds.TLS().RootFile,
			// Idle pooled HBONE connections go soon, so "after" is the
			// baseline again rather than a pool waiting for reuse.
			"POOL_UNUSED_RELEASE_TIMEOUT=2s",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("stopping daemons: %v", err)
		}
		if t.Failed() {
			for _, d := range c.AllDaemons() {
				log := d.Log()
				if len(log) > 20000 {
					log = "..." + log[len(log)-20000:]
				}
				t.Logf("daemon %s log:\n%s", d.Pod.Name, log)
			}
		}
	})
	for _, p := range []string{"long", "storm", "server"} {
		setPodSysctls(t, c.Pods[p])
	}
	srv := startEchoProcess(t, c.Pods["server"], 8080)
	nodes := []string{"node-a", "node-b"}
	daemons := map[string]*labrun.Daemon{"node-a": c.Daemons["node-a"], "node-b": c.Daemons["node-b"]}
	sample := func() map[string]labrun.Stats {
		out := map[string]labrun.Stats{}
		for _, n := range nodes {
			st, err := daemons[n].Stats(ctx)
			if err != nil {
				t.Fatalf("sampling %s: %v", n, err)
			}
			out[n] = st
		}
		return out
	}
	time.Sleep(500 * time.Millisecond) // let the fresh daemons settle
	base := sample()

	// 1. Open the long-lived connections, each checked with a first round.
	longs := make([]*longConn, plan.conns)
	var openErrs errLog
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 64 {
		wg.Go(func() {
			buf, got := make([]byte, 512), make([]byte, 512)
			for {
				i := int(next.Add(1) - 1)
				if i >= plan.conns {
					return
				}
				nc, err := c.Pods["long"].Dial(ctx, "tcp", srv.String())
				if err != nil {
					openErrs.add(err)
					continue
				}
				lc := &longConn{c: nc.(*net.TCPConn), rnd: rand.NewChaCha8([32]byte{byte(i), byte(i >> 8)}), sent: sha256.New(), recv: sha256.New()}
				if err := lc.round(buf, got); err != nil {
					nc.Close()
					openErrs.add(err)
					continue
				}
				longs[i] = lc
			}
		})
	}
	wg.Wait()
	if openErrs.n.Load() != 0 {
		t.Fatalf("opening %d long-lived connections: %v", plan.conns, &openErrs)
	}
	held := sample()

	// 2. The storm, traffic on the long connections and the policy pushes,
	// together, with the peak sampled every second.
	stop := make(chan struct{})
	var stormOK atomic.Int64
	var stormErrs, trafficErrs errLog
	tokens := make(chan struct{}, plan.workers)
	var bg sync.WaitGroup
	bg.Go(func() { // the rate: a token every 1/rate, in 10ms batches
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		owed := 0.0
		for {
			select {
			case <-stop:
				close(tokens)
				return
			case <-tick.C:
			}
			for owed += float64(plan.stormRate) / 100; owed >= 1; owed-- {
				select {
				case tokens <- struct{}{}:
				default: // the workers are behind: the rate is what they sustain
				}
			}
		}
	})
	storm := c.Pods["storm"]
	for w := range plan.workers {
		bg.Go(func() {
			msg := []byte(fmt.Sprintf("storm worker %d says hello", w))
			for range tokens {
				nc, err := storm.Dial(ctx, "tcp", srv.String())
				if err != nil {
					stormErrs.add(err)
					continue
				}
				got, err := roundTrip(nc.(*net.TCPConn), msg)
				nc.Close()
				if err == nil && !bytes.Equal(got, msg) {
					err = fmt.Errorf("storm echo %q", got)
				}
				if err != nil {
					stormErrs.add(err)
					continue
				}
				stormOK.Add(1)
			}
		})
	}
	for w := range 8 {
		bg.Go(func() {
			buf, got := make([]byte, 4096), make([]byte, 4096)
			// Worker w owns the connections w, w+8, w+16, ...: no two
			// workers ever share one.
			for i := w; ; i += 8 {
				if i >= plan.conns {
					i = w
				}
				select {
				case <-stop:
					return
				default:
				}
				if err := longs[i].round(buf, got); err != nil {
					trafficErrs.add(fmt.Errorf("long connection %d: %w", i, err))
					return
				}
			}
		})
	}
	var pushes atomic.Int64
	bg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			// A new namespace-wide policy generation each second: every
			// daemon re-checks every open connection against it. It denies
			// an identity nobody has, so the traffic must keep flowing.
			n := pushes.Add(1)
			xds.Set(xdsconv.AuthorizationType, "default/churn", fmt.Sprint(n), &securityapi.Authorization{
				Name: "churn", Namespace: "default", Scope: securityapi.Scope_NAMESPACE, Action: securityapi.Action_DENY,
				Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{
					Principals: []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Exact{
						Exact: fmt.Sprintf("cluster.local/ns/default/sa/nobody-%d", n)}}},
				}}}}}},
			})
		}
	})
	peak := held
	stormStart := time.Now()
	for time.Since(stormStart) < plan.stormFor {
		time.Sleep(time.Second)
		for n, st := range sample() {
			p := peak[n]
			peak[n] = labrun.Stats{
				RSS: max(p.RSS, st.RSS), FDs: max(p.FDs, st.FDs), Threads: max(p.Threads, st.Threads), Goroutines: max(p.Goroutines, st.Goroutines),
				HeapInuse: max(p.HeapInuse, st.HeapInuse), StackInuse: max(p.StackInuse, st.StackInuse),
			}
		}
	}
	close(stop)
	bg.Wait()
	stormElapsed := time.Since(stormStart)
	if n := trafficErrs.n.Load(); n != 0 {
		t.Errorf("traffic on the long-lived connections: %v", &trafficErrs)
	}
	if n := stormErrs.n.Load(); n != 0 {
		t.Errorf("storm: %d of %d short connections failed: %v", n, n+stormOK.Load(), &stormErrs)
	}
	for _, r := range xds.AllRequests() {
		if r.IsNack() {
			t.Errorf("a policy push was NACKed: %s", r.ErrorDetail.GetMessage())
			break
		}
	}

	// 3. Every long-lived connection is still there: a last round, a clean
	// close, and the checksums of everything it carried.
	var total atomic.Int64
	var closeErrs errLog
	next.Store(0)
	for range 64 {
		wg.Go(func() {
			buf, got := make([]byte, 512), make([]byte, 512)
			for {
				i := int(next.Add(1) - 1)
				if i >= plan.conns {
					return
				}
				lc := longs[i]
				err := lc.round(buf, got)
				if err == nil {
					err = lc.finish()
				} else {
					lc.c.Close()
				}
				if err != nil {
					closeErrs.add(fmt.Errorf("long connection %d: %w", i, err))
				}
				total.Add(lc.bytes)
			}
		})
	}
	wg.Wait()
	if n := closeErrs.n.Load(); n != 0 {
		t.Errorf("closing the long-lived connections: %v", &closeErrs)
	}

	// 4. Back to the baseline: descriptors, goroutines and the live heap
	// (with room for the runtime's own). RSS is only reported: the runtime
	// hands freed pages back to the kernel at its own pace.
	const fdSlack, goroutineSlack = 40, 80
	back := func(s map[string]labrun.Stats) bool {
		for _, n := range nodes {
			if s[n].FDs > base[n].FDs+fdSlack || s[n].Goroutines > base[n].Goroutines+goroutineSlack {
				return false
			}
		}
		return true
	}
	after := sample()
	for deadline := time.Now().Add(time.Minute); !back(after) && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		after = sample()
	}
	// Once more: buffers returned to a sync.Pool survive one collection
	// (in its victim cache) and go with the second.
	after = sample()
	// The Go runtime never frees a goroutine's descriptor (runtime.malg,
	// a few hundred bytes): they wait on a free list for reuse. So the
	// heap keeps about that much per goroutine of the peak, plus room.
	heapSlack := func(n string) uint64 { return 16<<20 + 1024*uint64(max(0, peak[n].Goroutines-base[n].Goroutines)) }
	for _, n := range nodes {
		if after[n].FDs > base[n].FDs+fdSlack {
			t.Errorf("%s: %d descriptors after the load, baseline %d", n, after[n].FDs, base[n].FDs)
		}
		if after[n].Goroutines > base[n].Goroutines+goroutineSlack {
			t.Errorf("%s: %d goroutines after the load, baseline %d", n, after[n].Goroutines, base[n].Goroutines)
		}
		if after[n].HeapInuse > base[n].HeapInuse+heapSlack(n) {
			t.Errorf("%s: %d MiB of heap in use after the load, baseline %d MiB", n, after[n].HeapInuse>>20, base[n].HeapInuse>>20)
		}
	}

	// ZTUNNEL_SOAK_PROFILES=<dir> keeps the daemons' heap profiles of the
	// "after" phase, to see what a run left behind.
	if dir := os.Getenv("ZTUNNEL_SOAK_PROFILES"); dir != "" {
		for _, n := range nodes {
			code, body, err := daemons[n].Get(ctx, "http://127.0.0.1:15000/debug/pprof/heap?gc=1")
			if err != nil || code != 200 {
				t.Errorf("heap profile of %s: %d %v", n, code, err)
				continue
			}
			if err := os.WriteFile(fmt.Sprintf("%s/heap-after-%s.pb.gz", dir, n), body, 0o644); err != nil {
				t.Error(err)
			}
			if _, text, err := daemons[n].Get(ctx, "http://127.0.0.1:15000/debug/pprof/heap?gc=1&debug=1"); err == nil {
				os.WriteFile(fmt.Sprintf("%s/heap-after-%s.txt", dir, n), text, 0o644)
			}
		}
	}

	// The figures.
	var out strings.Builder
	rate := float64(stormOK.Load()) / stormElapsed.Seconds()
	fmt.Fprintf(&out, "load %q: %d concurrent connections held through node-a -> node-b (HBONE), %.1f MiB verified by checksum\n",
		plan.name, plan.conns, float64(total.Load())/(1<<20))
	fmt.Fprintf(&out, "storm: %d short connections in %v = %.0f conns/s sustained (asked %d/s, %d in flight at most), %d failed; %d policy pushes (one a second)\n",
		stormOK.Load(), stormElapsed.Round(time.Millisecond), rate, plan.stormRate, plan.workers, stormErrs.n.Load(), pushes.Load())
	tw := tabwriter.NewWriter(&out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "daemon\tphase\tRSS MiB\theap MiB\tstacks MiB\tfds\tgoroutines\tthreads\tRSS B/conn\theap B/conn\tgoroutines/conn\tfds/conn\t")
	for _, n := range nodes {
		b := base[n]
		for _, ph := range []struct {
			name string
			s    labrun.Stats
		}{{"before", b}, {"held", held[n]}, {"peak", peak[n]}, {"after", after[n]}} {
			per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(plan.conns) }
			st := ph.s
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.1f\t%d\t%d\t%d\t%.0f\t%.0f\t%.2f\t%.2f\t\n", n, ph.name,
				float64(st.RSS)/(1<<20), float64(st.HeapInuse)/(1<<20), float64(st.StackInuse)/(1<<20), st.FDs, st.Goroutines, st.Threads,
				per(st.RSS, b.RSS), per(st.HeapInuse, b.HeapInuse),
				per(uint64(st.Goroutines), uint64(b.Goroutines)), per(uint64(st.FDs), uint64(b.FDs)))
		}
	}
	tw.Flush()
	t.Log("\n" + out.String())
}
