package harness

import (
	"context"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/bench/report"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLabConfig(t *testing.T) {
	lc, err := xdsconv.ParseLocalConfig(labConfig([]string{"std", "uring"}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"mcli-std": "10.244.0.2", "mcli-uring": "10.244.0.3", "msrv-std": "10.244.1.2", "msrv-uring": "10.244.1.3",
	}
	if len(lc.Workloads) != len(want) {
		t.Fatalf("%d workloads, want %d", len(lc.Workloads), len(want))
	}
	for _, w := range lc.Workloads {
		if ip := want[w.Name]; len(w.Addresses) != 1 || w.Addresses[0].String() != ip {
			t.Errorf("%s at %v, want %s", w.Name, w.Addresses, ip)
		}
		if got := w.Identity().String(); got != spiffe(w.Name) {
			t.Errorf("%s has identity %s, want %s", w.Name, got, spiffe(w.Name))
		}
	}
}

func TestHAProxyConfig(t *testing.T) {
	on := haproxyConfig("127.0.0.1:9002", "10.244.1.3:8080", true)
	off := haproxyConfig("127.0.0.1:9003", "10.244.1.3:8080", false)
	if !strings.Contains(on, "\n    option splice-auto\n") || !strings.Contains(off, "no option splice-auto") {
		t.Fatalf("splice options:\n%s\n%s", on, off)
	}
	for _, want := range []string{"mode tcp", "bind 127.0.0.1:9002", "server s1 10.244.1.3:8080", "maxconn 6000", "timeout client 2m"} {
		if !strings.Contains(on, want) {
			t.Errorf("config lacks %q:\n%s", want, on)
		}
	}
	if path, err := exec.LookPath("haproxy"); err == nil {
		f := filepath.Join(t.TempDir(), "h.cfg")
		os.WriteFile(f, []byte(on), 0o600)
		if out, err := exec.Command(path, "-c", "-q", "-f", f).CombinedOutput(); err != nil {
			t.Fatalf("haproxy -c: %v: %s", err, out)
		}
	}
}

func TestHeapStats(t *testing.T) {
	body := []byte("heap profile: 1: 2 [3: 4] @ heap/1048576\n\n# runtime.MemStats\n# Alloc = 1\n# HeapSys = 8192000\n# HeapInuse = 4096000\n# HeapReleased = 1024000\n")
	inuse, committed, err := heapStats(body)
	if err != nil || inuse != 4096000 || committed != 8192000-1024000 {
		t.Fatalf("heapStats = %d, %d, %v", inuse, committed, err)
	}
	if _, _, err := heapStats([]byte("goroutine profile: total 3\n")); err == nil {
		t.Fatal("a goroutine profile gave heap statistics")
	}
}

func TestCheckQuick(t *testing.T) {
	r := &report.Run{
		Settings: report.Settings{RRSizes: []report.RRSize{{Req: 1, Resp: 1}}},
		Configs:  []report.Config{{ID: "direct", Direct: true}, {ID: "tcp/ztunnel-std", Daemon: true}},
	}
	for _, id := range []string{"direct", "tcp/ztunnel-std"} {
		r.Samples = append(r.Samples,
			report.Sample{Config: id, Metric: report.MetricTput1, Gbps: 1},
			report.Sample{Config: id, Metric: report.MetricTputN, Gbps: 1},
			report.Sample{Config: id, Metric: "rr-1x1", PerSecond: 1},
			report.Sample{Config: id, Metric: report.MetricCPS, PerSecond: 1},
		)
	}
	err := checkQuick(r)
	if err == nil || !strings.Contains(err.Error(), "tcp/ztunnel-std idle") || !strings.Contains(err.Error(), "tcp/ztunnel-std profile") {
		t.Fatalf("checkQuick without idle and profile: %v", err)
	}
	r.Idle = []report.Idle{{Config: "tcp/ztunnel-std", Points: []report.IdlePoint{{}, {Conns: 10}}}}
	r.Profiles = []report.Profile{{Config: "tcp/ztunnel-std", Summary: report.ProfileSummary{CPUSeconds: 0.5}}}
	if err := checkQuick(r); err != nil {
		t.Fatal(err)
	}
	r.Samples[4].Gbps = 0 // the daemon's one-stream throughput
	if err := checkQuick(r); err == nil {
		t.Fatal("a zero figure passed")
	}
}

func TestDescribeMachine(t *testing.T) {
	m := DescribeMachine("")
	if m.Cores <= 0 || m.GoVersion == "" || m.Kernel == "" {
		t.Fatalf("machine: %+v", m)
	}
}

// TestQuickRun is the whole quick benchmark; it needs root, the binaries
// (make bench-quick builds them) and about a minute, so it runs only with
// ZBENCH_BIN=<dir holding ztunnel, zload and zpeer>. CI runs
// `make bench-quick` instead.
func TestQuickRun(t *testing.T) {
	bin := os.Getenv("ZBENCH_BIN")
	if bin == "" {
		t.Skip("set ZBENCH_BIN to a directory with the ztunnel, zload and zpeer binaries (or run make bench-quick)")
	}
	netnslab.RequireRoot(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run, err := Run(ctx, Options{
		Quick: true, OutDir: out, Prefix: "zl-benchtest",
		Ztunnel: filepath.Join(bin, "ztunnel"), Zload: filepath.Join(bin, "zload"), Zpeer: filepath.Join(bin, "zpeer"),
		Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := report.Write(out, run); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, report.FileReport)); err != nil {
		t.Fatal(err)
	}
}

// TestProcessPlumbing checks, in a real lab, what the harness relies on to
// find and measure processes: a child runs inside a pod's namespace,
// findPid finds it there by executable, and nsGet reaches a loopback-only
// pprof endpoint inside the pod.
func TestProcessPlumbing(t *testing.T) {
	lab := netnslab.New(t)
	node, err := lab.AddNode("n")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := node.AddPod("p")
	if err != nil {
		t.Fatal(err)
	}
	sleep := netnslab.RequireTool(t, "sleep", "coreutils")
	ctx := context.Background()
	c, err := startChild(ctx, pod.NS, "sleep", nil, sleep, "30")
	if err != nil {
		t.Fatal(err)
	}
	defer c.stop()
	// Until ip netns exec has exec'ed sleep.
	var pid int
	nettest.Until(2*time.Second, func() bool { pid, err = findPid(pod.NetNS, sleep); return err == nil })
	if err != nil || pid != c.pid() {
		t.Fatalf("findPid = %d, %v; want the child %d", pid, err, c.pid())
	}
	if _, err := findPid(node.NetNS, sleep); err == nil {
		t.Fatal("found the pod's process in the node's namespace")
	}

	ln, err := pod.Listen("tcp", "127.0.0.1:6060")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	srv := &http.Server{Handler: mux}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	defer func() {
		srv.Close()
		<-done
	}()
	mc := pprofCounts(ctx, &proc{name: "self", ns: pod.NS, pprof: "http://127.0.0.1:6060"})
	if mc.goroutines <= 0 || mc.heapKiB <= 0 || mc.heapSysKiB <= 0 {
		t.Fatalf("pprofCounts = %+v", mc)
	}
	c.stop()
	if !c.exited() {
		t.Fatal("the child survived stop")
	}
}

func TestParseVariant(t *testing.T) {
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, spec string
		want       Variant
		wantErr    bool
	}{
		{"engine only", "epoll", Variant{Engine: "epoll"}, false},
		{"binary", "epoll@" + bin, Variant{Engine: "epoll", Binary: bin}, false},
		{"environment", "std+GOGC=50+A=b=c", Variant{Engine: "std", Env: []string{"GOGC=50", "A=b=c"}}, false},
		{"missing binary", "epoll@/nonexistent/ztunnel", Variant{}, true},
		{"not an assignment", "epoll+GOGC", Variant{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseVariant(tc.spec)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseVariant(%q) error %v, want error %v", tc.spec, err, tc.wantErr)
			}
			if !tc.wantErr && !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseVariant(%q) = %+v, want %+v", tc.spec, got, tc.want)
			}
		})
	}
}

// A run that measured the fixed-rate CPU must have that figure for every
// path too.
func TestCheckQuickFixedRate(t *testing.T) {
	r := &report.Run{
		Settings: report.Settings{FixedRate: report.FixedRate{Rate: 1000, Conns: 10, Size: 1024}},
		Configs:  []report.Config{{ID: "direct", Direct: true}},
	}
	for _, m := range []string{report.MetricTput1, report.MetricTputN} {
		r.Samples = append(r.Samples, report.Sample{Config: "direct", Metric: m, Gbps: 1})
	}
	r.Samples = append(r.Samples, report.Sample{Config: "direct", Metric: report.MetricCPS, PerSecond: 1})
	if err := checkQuick(r); err == nil || !strings.Contains(err.Error(), "direct fixed") {
		t.Fatalf("checkQuick without the fixed-rate figure: %v", err)
	}
	r.Samples = append(r.Samples, report.Sample{Config: "direct", Metric: report.MetricFixedRate, PerSecond: 1000})
	if err := checkQuick(r); err != nil {
		t.Fatal(err)
	}
}
