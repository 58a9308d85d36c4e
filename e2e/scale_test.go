package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/pprof/profile"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/bench/harness"
	"github.com/ztunnel-go/ztunnel/bench/report"
	"github.com/ztunnel-go/ztunnel/internal/labrun"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// scaleEnv selects the mesh-scale run (issue 36): unset, the quick variant
// (one small mesh, a few probes: seconds, so the scenario never rots);
// "full" (make bench-scale), 1k, 10k and 100k workloads with the report
// written; or a comma-separated list of workload counts.
const scaleEnv = "ZTUNNEL_SCALE"

// scaleProfileEnv, set to a number of seconds, has every size's churn phase
// profiled: the daemon's CPU profile over that many seconds and an
// execution trace over its first second, taken while the change probes run
// and the churn goes on (it is kept up until the profile ends), written
// into the report directory as cpu-churn-<n>.pb.gz and trace-churn-<n>.out.
const scaleProfileEnv = "ZTUNNEL_SCALE_PROFILE"

// scaleOutEnv names the report directory (default: a temporary directory
// for the quick run, bench/results/<date>-<host>-scale for the others).
const scaleOutEnv = "ZTUNNEL_SCALE_OUT"

// scaleTopology is the lab: a client and a server pod with their daemons.
// The synthetic mesh lives in xDS only (no pods): 10.128.0.0/10 for its
// workloads, 10.96.0.0/16 for its VIPs, neither routed in the lab.
const scaleTopology = `
workloads:
- {uid: u-client, name: client, namespace: default, serviceAccount: client, workloadIps: ["10.244.1.2"], protocol: HBONE, node: node-a, services: {}}
- {uid: u-server, name: server, namespace: default, serviceAccount: server, workloadIps: ["10.244.2.2"], protocol: HBONE, node: node-b, services: {}}
`

const (
	scaleProbeKey  = "default/probe.default.svc.cluster.local"
	scaleProbeVIP  = "10.96.255.254"
	scaleDenyName  = "default/scale-deny"
	scalePodsNS    = 100 // workloads per namespace, and per node
	scaleReplicas  = 5   // workloads per service (one app, one service account)
	scaleSelectRun = 10  // every 10th app has a WORKLOAD_SELECTOR policy
)

// scaleMesh is the synthetic mesh of one size, as istiod would push it:
// apps of scaleReplicas pods, each app a service and a service account, 100
// pods per namespace and per node, every 10th app selected by a policy
// (every 4th of those policies is namespace-scoped instead).
type scaleMesh struct {
	workloads, services, policies int
}

func newScaleMesh(n int) scaleMesh {
	apps := n / scaleReplicas
	return scaleMesh{workloads: apps * scaleReplicas, services: apps, policies: (apps + scaleSelectRun - 1) / scaleSelectRun}
}

func (m scaleMesh) namespaces() int { return max(1, m.workloads/scalePodsNS) }

func (m scaleMesh) ns(app int) string { return "ns-" + strconv.Itoa(app%m.namespaces()) }

func (m scaleMesh) svcKey(app int) string {
	ns := m.ns(app)
	return ns + "/app-" + strconv.Itoa(app) + "." + ns + ".svc.cluster.local"
}

func (m scaleMesh) policyName(app int) string {
	if app/scaleSelectRun%4 == 3 {
		return "ns-policy-" + strconv.Itoa(app)
	}
	return "allow-app-" + strconv.Itoa(app)
}

// workload returns workload i of the mesh and its resource name (its uid).
func (m scaleMesh) workload(i int, unhealthy bool) (string, *workloadapi.Address) {
	app := i / scaleReplicas
	ns, appName := m.ns(app), "app-"+strconv.Itoa(app)
	name := fmt.Sprintf("%s-%08x-%05x", appName, uint32(app)*2654435761, uint32(i)*40503&0xfffff)
	uid := "Kubernetes//Pod/" + ns + "/" + name
	ip := netip.AddrFrom4([4]byte{10, byte(128 + i>>16), byte(i >> 8), byte(i)})
	w := &workloadapi.Workload{
		Uid: uid, Name: name, Namespace: ns, ServiceAccount: appName, TrustDomain: "cluster.local",
		Node: "node-" + strconv.Itoa(i%max(1, m.workloads/scalePodsNS)), ClusterId: "Kubernetes",
		Addresses: [][]byte{ip.AsSlice()}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		WorkloadName: appName, WorkloadType: workloadapi.WorkloadType_DEPLOYMENT,
		CanonicalName: appName, CanonicalRevision: "v1",
		Services: map[string]*workloadapi.PortList{m.svcKey(app): {Ports: []*workloadapi.Port{
			{ServicePort: 80, TargetPort: 8080}, {ServicePort: 9090, TargetPort: 9090},
		}}},
		Capacity: wrapperspb.UInt32(1),
		Locality: &workloadapi.Locality{Region: "us-east1", Zone: "us-east1-" + string(rune('a'+i%3))},
	}
	if unhealthy {
		w.Status = workloadapi.WorkloadStatus_UNHEALTHY
	}
	if app%scaleSelectRun == 0 && !strings.HasPrefix(m.policyName(app), "ns-") {
		w.AuthorizationPolicies = []string{ns + "/" + m.policyName(app)}
	}
	return uid, &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

// resources returns every Address and Authorization resource of the mesh.
func (m scaleMesh) resources(t *testing.T) (addrs, pols []*discoveryv3.Resource) {
	for i := range m.workloads {
		name, a := m.workload(i, false)
		addrs = append(addrs, xdstest.NewResource(t, name, "1", a))
	}
	for app := range m.services {
		ns, appName := m.ns(app), "app-"+strconv.Itoa(app)
		vip := netip.AddrFrom4([4]byte{10, 96, byte(app >> 8), byte(app)})
		addrs = append(addrs, xdstest.NewResource(t, m.svcKey(app), "1", &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: appName, Namespace: ns, Hostname: appName + "." + ns + ".svc.cluster.local",
			Addresses: []*workloadapi.NetworkAddress{{Address: vip.AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 9090, TargetPort: 9090}},
		}}}))
		if app%scaleSelectRun != 0 {
			continue
		}
		name := m.policyName(app)
		scope := securityapi.Scope_WORKLOAD_SELECTOR
		if strings.HasPrefix(name, "ns-") {
			scope = securityapi.Scope_NAMESPACE
		}
		peer := "cluster.local/ns/" + m.ns(app+1) + "/sa/app-" + strconv.Itoa(app+1)
		pols = append(pols, xdstest.NewResource(t, ns+"/"+name, "1", &securityapi.Authorization{
			Name: name, Namespace: ns, Scope: scope, Action: securityapi.Action_ALLOW,
			Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{
				{Matches: []*securityapi.Match{{Principals: []*securityapi.StringMatch{
					{MatchType: &securityapi.StringMatch_Exact{Exact: peer}},
					{MatchType: &securityapi.StringMatch_Prefix{Prefix: "cluster.local/ns/" + ns + "/"}},
				}}}},
				{Matches: []*securityapi.Match{{DestinationPorts: []uint32{8080, 9090}}}},
			}}},
		}))
	}
	return addrs, pols
}

// scaleLabWorkload is one of the lab's two workloads as pushed over xDS.
func scaleLabWorkload(t *testing.T, name, ip, node string, unhealthy bool) *discoveryv3.Resource {
	a := xdsWorkload(name, ip, node)
	w := a.GetWorkload()
	if name == "server" {
		w.Services = map[string]*workloadapi.PortList{scaleProbeKey: {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}}
	}
	if unhealthy {
		w.Status = workloadapi.WorkloadStatus_UNHEALTHY
	}
	return xdstest.NewResource(t, "u-"+name, strconv.FormatInt(time.Now().UnixNano(), 36), a)
}

// TestMeshScale is issue 36's Mesh scenario: a dedicated daemon fed a mesh
// of workloads, services and policies over delta xDS, at growing sizes:
// its memory per workload, the time and CPU from the first byte of the
// initial push to synced, connection set-up through a VIP, and how soon
// one Address or Authorization change reaches the data path while 100
// unrelated changes a second are pushed. See scaleEnv for the variants;
// the quick one only checks that every figure was produced.
func TestMeshScale(t *testing.T) {
	if missing := netnslab.Missing(); missing != "" {
		netnslab.Skip(t, missing)
	}
	sizes, quick := []int{1000}, true
	switch v := os.Getenv(scaleEnv); v {
	case "":
	case "full":
		sizes, quick = []int{1000, 10000, 100000}, false
	default:
		sizes, quick = nil, false
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < scaleReplicas {
				t.Fatalf("%s=%q: want full or workload counts", scaleEnv, v)
			}
			sizes = append(sizes, n)
		}
	}
	out := scaleOutDir(t, quick)
	probes, setups := 50, 200
	if quick {
		probes, setups = 5, 20
	}
	run := &report.Scale{Machine: harness.DescribeMachine(""), Quick: quick, ChurnPerSecond: 100}
	t.Run("baseline", func(t *testing.T) {
		run.Baseline = measureMesh(t, newScaleMesh(0), 0, 0, !quick, "", nil)
	})
	for _, n := range sizes {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			var heap *report.ScaleHeap
			if !quick {
				heap = &report.ScaleHeap{}
			}
			p := measureMesh(t, newScaleMesh(n), probes, setups, !quick, out, heap)
			run.Points = append(run.Points, p)
			if heap != nil {
				run.HeapProfiles = append(run.HeapProfiles, *heap)
			}
			rss, hp := run.PerWorkload(p)
			t.Logf("%d workloads, %d services, %d policies: RSS %.0f B/workload, heap %.0f B/workload, synced %v after the first byte (CPU %v), VIP set-up p50 %v p99 %v, Address change p50 %v p99 %v, Authorization change p50 %v p99 %v",
				p.Workloads, p.Services, p.Policies, rss, hp, p.Sync.Round(time.Millisecond), p.CPU.Round(time.Millisecond),
				p.Setup.P50, p.Setup.P99, p.AddressChange.P50, p.AddressChange.P99, p.AuthzChange.P50, p.AuthzChange.P99)
		})
	}
	run.Machine.LoadEnd = harness.LoadAvg()
	if t.Failed() {
		return
	}
	for _, p := range run.Points {
		if p.Sync <= 0 || p.CPU <= 0 || p.RSSKiB <= 0 || p.HeapInuseKiB <= 0 ||
			p.Setup.N != setups || p.AddressChange.N != 2*probes || p.AuthzChange.N != 2*probes {
			t.Errorf("%d workloads: a figure is missing: %+v", p.Workloads, p)
		}
	}
	if err := report.WriteScale(out, run); err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %s", filepath.Join(out, report.FileScaleReport))
}

// measureMesh starts the lab with mesh m in xDS and measures it (the
// probes and set-ups are skipped when zero). With settle, memory is read
// again once the daemon has released what the push freed (the quick run
// does not wait for it). With heap set, the daemon's heap profile is
// written into out and summarized there.
func measureMesh(t *testing.T, m scaleMesh, probes, setups int, settle bool, out string, heap *report.ScaleHeap) report.ScalePoint {
	p := report.ScalePoint{Workloads: m.workloads, Services: m.services, Policies: m.policies}
	lab := netnslab.New(t)
	cp := startControlPlane(t, lab)
	xds := cp.xds
	addrs, pols := m.resources(t)
	addrs = append(addrs,
		scaleLabWorkload(t, "client", "10.244.1.2", "node-a", false),
		scaleLabWorkload(t, "server", "10.244.2.2", "node-b", false),
		xdstest.NewResource(t, scaleProbeKey, "1", &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: "probe", Namespace: "default", Hostname: "probe.default.svc.cluster.local",
			Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(scaleProbeVIP).AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
		}}}))
	xds.Update(xdsconv.AddressType, addrs, nil)
	xds.Update(xdsconv.AuthorizationType, pols, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := startCluster(ctx, t, lab, scaleTopology, labrun.ClusterOptions{
		// The memory releaser's debug line says when what the push freed
		// has gone back to the OS.
		Binary: ztunnelBin, Dir: t.TempDir(), DaemonEnv: cp.env(), LogLevel: "warn,gc=debug",
	})
	d := c.Daemons["client"]
	cpu, err := d.CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	p.CPU = cpu
	p.Sync = syncTime(t, xds.AllRequests())

	// Memory once synced, then once the daemon has gone quiet and handed
	// back what the push freed (internal/app/release.go: 3 s after the
	// burst, at most one release per 10 s), as on a node between pushes.
	// A small push may leave nothing worth releasing: the wait is bounded,
	// and the reading taken anyway.
	st, err := d.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.SyncedRSSKiB = int64(st.RSS >> 10)
	if settle {
		const released = "returned freed memory to the OS"
		before := strings.Count(d.Log(), released)
		p.Released = eventually(45*time.Second, 100*time.Millisecond, func() bool { return strings.Count(d.Log(), released) > before })
		if st, err = d.Stats(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p.RSSKiB, p.HeapInuseKiB, p.HeapLiveKiB = int64(st.RSS>>10), int64(st.HeapInuse>>10), int64(st.HeapAlloc>>10)
	t.Logf("%d workloads, quiet: %v", m.workloads, st)
	if heap != nil {
		writeScaleHeap(ctx, t, d, out, fmt.Sprintf("heap-%d.pb.gz", m.workloads), m.workloads, heap)
	}
	if setups == 0 && probes == 0 {
		return p
	}

	startEcho(t, c.Pods["server"], 8080)
	client := c.Pods["client"]
	vip := netip.AddrPortFrom(netip.MustParseAddr(scaleProbeVIP), 80)
	direct := netip.AddrPortFrom(c.Pods["server"].IP, 8080)
	var lat []time.Duration
	for range setups {
		start := time.Now()
		if !scaleAttempt(ctx, client, vip) {
			t.Fatal("a connection through the probe VIP failed")
		}
		lat = append(lat, time.Since(start))
	}
	p.Setup = report.PercentilesOf(lat)

	stopChurn := scaleChurn(t, xds, m, 100)
	defer stopChurn()
	if secs := os.Getenv(scaleProfileEnv); secs != "" && out != "" {
		profiled := profileChurn(ctx, t, d, out, m.workloads, secs)
		defer profiled()
	}
	// waitFor pushes a change and returns how long until a connection to
	// dst shows it (works is what that connection should do).
	waitFor := func(push func(), dst netip.AddrPort, works bool) time.Duration {
		pushed := time.Now()
		push()
		deadline := pushed.Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if scaleAttempt(ctx, client, dst) == works {
				return time.Since(pushed)
			}
		}
		t.Fatalf("a connection to %s did not become works=%v within 30s of the push", dst, works)
		return 0
	}
	var addrLat, authLat []time.Duration
	for range probes {
		addrLat = append(addrLat,
			waitFor(func() {
				xds.Update(xdsconv.AddressType, []*discoveryv3.Resource{scaleLabWorkload(t, "server", "10.244.2.2", "node-b", true)}, nil)
			}, vip, false),
			waitFor(func() {
				xds.Update(xdsconv.AddressType, []*discoveryv3.Resource{scaleLabWorkload(t, "server", "10.244.2.2", "node-b", false)}, nil)
			}, vip, true))
		authLat = append(authLat,
			waitFor(func() {
				xds.Update(xdsconv.AuthorizationType, []*discoveryv3.Resource{xdstest.NewResource(t, scaleDenyName, strconv.FormatInt(time.Now().UnixNano(), 36), &securityapi.Authorization{
					Name: "scale-deny", Namespace: "default", Scope: securityapi.Scope_NAMESPACE, Action: securityapi.Action_DENY,
					Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{
						Principals: []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Exact{Exact: "cluster.local/ns/default/sa/client"}}},
					}}}}}},
				})}, nil)
			}, direct, false),
			waitFor(func() { xds.Remove(xdsconv.AuthorizationType, scaleDenyName) }, direct, true))
	}
	p.AddressChange, p.AuthzChange = report.PercentilesOf(addrLat), report.PercentilesOf(authLat)
	return p
}

// scaleAttempt connects from pod to dst through its daemon and reports
// whether a 1-byte round trip made it (a denied or unroutable connection
// is reset or closed by a daemon).
func scaleAttempt(ctx context.Context, pod *netnslab.Pod, dst netip.AddrPort) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pod.Dial(ctx, "tcp", dst.String())
	if err != nil {
		return false
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte{'x'}); err != nil {
		return false
	}
	_, err = io.ReadFull(conn, make([]byte, 1))
	return err == nil
}

// syncTime is, for the first stream (the client daemon's, started first),
// the time from its first request (answered at once: the first byte) to
// its first ACK of each type, whichever is later.
func syncTime(t *testing.T, reqs []*xdstest.Request) time.Duration {
	var first time.Time
	acked := map[string]time.Time{}
	for _, r := range reqs {
		if r.Stream != 1 {
			continue
		}
		if first.IsZero() {
			first = r.Received
		}
		if r.IsAck() && acked[r.TypeUrl].IsZero() {
			acked[r.TypeUrl] = r.Received
		}
	}
	a, b := acked[xdsconv.AddressType], acked[xdsconv.AuthorizationType]
	if a.IsZero() || b.IsZero() {
		t.Fatalf("the daemon's stream has no ACK of both types: %v", acked)
	}
	last := a
	if b.After(a) {
		last = b
	}
	return last.Sub(first)
}

// scaleChurn pushes perSecond Address changes a second (a random workload of
// m turns unhealthy or healthy again) until the returned function is
// called.
func scaleChurn(t *testing.T, xds *xdstest.Server, m scaleMesh, perSecond int) func() {
	if m.workloads == 0 {
		return func() {}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		sick := map[int]bool{}
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		for v := 2; ; v++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			i := rng.IntN(m.workloads)
			sick[i] = !sick[i]
			name, a := m.workload(i, sick[i])
			xds.Update(xdsconv.AddressType, []*discoveryv3.Resource{xdstest.NewResource(t, name, strconv.Itoa(v), a)}, nil)
		}
	})
	return func() { close(stop); wg.Wait() }
}

// profileChurn starts the CPU profile and the trace of scaleProfileEnv and
// returns the function that waits for them and writes them out.
func profileChurn(ctx context.Context, t *testing.T, d *labrun.Daemon, out string, workloads int, secs string) func() {
	return profileDaemon(ctx, t, d, out, secs, fmt.Sprintf("churn-%d", workloads))
}

// profileDaemon starts d's CPU profile for secs seconds and its execution
// trace for the first of them (out/cpu-<name>.pb.gz, out/trace-<name>.out)
// and returns the function that waits for both.
func profileDaemon(ctx context.Context, t *testing.T, d *labrun.Daemon, out, secs, name string) func() {
	if n, err := strconv.Atoi(secs); err != nil || n < 1 {
		t.Fatalf("%s=%q: want a number of seconds", scaleProfileEnv, secs)
	}
	var wg sync.WaitGroup
	get := func(path, file string) {
		wg.Go(func() {
			code, body, err := d.Get(ctx, "http://127.0.0.1:15000/debug/pprof/"+path)
			if err != nil || code != 200 {
				t.Errorf("%s: %d %v", path, code, err)
				return
			}
			if err := os.WriteFile(filepath.Join(out, file), body, 0o644); err != nil {
				t.Error(err)
			}
		})
	}
	get("profile?seconds="+secs, "cpu-"+name+".pb.gz")
	get("trace?seconds=1", "trace-"+name+".out")
	// Both handlers answer only at the end; they sleep once the profiler
	// and the tracer run. Starting them stops the world and takes a few
	// milliseconds: what is measured must not begin before (the first adds
	// of a Node segment did, and read as its p99).
	started := nettest.Until(10*time.Second, func() bool {
		_, body, err := d.Get(ctx, "http://127.0.0.1:15000/debug/pprof/goroutine?debug=1")
		return err == nil && strings.Count(string(body), "net/http/pprof.sleep") >= 2
	})
	if !started {
		t.Errorf("%s: the daemon's profiler and tracer did not start within 10s", name)
	}
	return wg.Wait
}

// scaleOutDir is where a scale test writes its results: $ZTUNNEL_SCALE_OUT,
// a temporary directory for the quick variant, else a dated directory of
// bench/results.
func scaleOutDir(t *testing.T, quick bool) string {
	t.Helper()
	out := os.Getenv(scaleOutEnv)
	switch {
	case out != "":
	case quick:
		out = t.TempDir()
	default:
		host, _ := os.Hostname()
		out = filepath.Join("..", "bench", "results", time.Now().Format("2006-01-02")+"-"+host+"-scale")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

// writeScaleHeap saves the daemon's heap profile (after a collection) as
// file in out and summarizes it into heap (size: the workloads, or pods, it
// was taken at).
func writeScaleHeap(ctx context.Context, t *testing.T, d *labrun.Daemon, out, file string, size int, heap *report.ScaleHeap) {
	code, body, err := d.Get(ctx, "http://127.0.0.1:15000/debug/pprof/heap?gc=1")
	if err != nil || code != 200 {
		t.Fatalf("heap profile: %d %v", code, err)
	}
	heap.Workloads, heap.File = size, file
	if err := os.WriteFile(filepath.Join(out, heap.File), body, 0o644); err != nil {
		t.Fatal(err)
	}
	prof, err := profile.Parse(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if heap.Summary, err = report.SummarizeHeap(prof, 12); err != nil {
		t.Fatal(err)
	}
}
