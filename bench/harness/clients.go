package harness

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/bench/report"
)

// Issue 36's "two clients, two verdicts": the daemon pair against the
// HAProxy mTLS pair read 0.85× by zload's round trip but 1.09-1.13× by a
// blocking Python client, and iperf3's one stream read worse than zload's.
// zbench --clients measures every client on the same paths in the same run,
// rounds interleaved, so that the verdicts can be compared.

// The clients of zbench --clients.
const (
	ClientZloadRR    = "zload-rr"    // zload rr, 1 B each way, one connection (Go, netpoller)
	ClientPythonRR   = "python-rr"   // rrclient.py: blocking socket, one thread
	ClientZloadTput1 = "zload-tput1" // zload throughput, one stream, 128 KiB writes
	ClientIperf3     = "iperf3"      // iperf3 -c, one stream (its default 128 KiB writes)
)

// clientKinds is the order in which a round runs the clients.
var clientKinds = []string{ClientZloadRR, ClientPythonRR, ClientZloadTput1, ClientIperf3}

// ClientsFile and ClientsReport are zbench --clients' outputs.
const (
	ClientsFile   = "clients.json"
	ClientsReport = "CLIENTS.md"
)

//go:embed rrclient.py
var rrClientPy []byte

// Lab ports of the iperf3 servers and of the HAProxy pair in front of them.
const (
	iperfPort           = 5201 // iperf3 -s in every server pod
	haproxyIperfPairSrv = 9448 // HAProxy mTLS pair to iperf3, server half (server pod)
	haproxyIperfPairCli = 9008 // HAProxy mTLS pair to iperf3, client half (client pod)
)

// ClientsOptions shape zbench --clients.
type ClientsOptions struct {
	// Count is the round trips of each RR sample (default 5000; quick 200).
	Count int64
	// Python is the Python 3 interpreter (default: python3 from PATH).
	Python string
	// Iperf3 is the iperf3 binary (default: from PATH).
	Iperf3 string
	// Hold, if positive, keeps the lab up this long before the rounds,
	// after logging each client's command on each path: time to profile
	// one path by hand (perf, strace, ss) with the exact commands.
	Hold time.Duration
}

// ClientSample is one client's figure on one path in one round.
type ClientSample struct {
	Path   string `json:"path"`
	Client string `json:"client"`
	Round  int    `json:"round"`
	// RR clients: latency percentiles (µs) and round trips per second.
	P50us     float64 `json:"p50_us,omitempty"`
	P99us     float64 `json:"p99_us,omitempty"`
	PerSecond float64 `json:"per_second,omitempty"`
	// Throughput clients: Gbit/s received (iperf3: by its server).
	Gbps float64 `json:"gbps,omitempty"`
	// Retransmits is iperf3's count of the sender's TCP retransmits.
	Retransmits int64 `json:"retransmits,omitempty"`
	// Seconds the client measured over.
	Seconds float64 `json:"seconds"`
	// CPUus is the path's proxies' CPU (user and system, all of them) per
	// round trip (RR) or per MB moved (throughput), in µs, over the
	// client's whole invocation.
	CPUus float64 `json:"cpu_us"`
	// Procs is CPUus by process, the path's proxies in order (client side
	// first), so that one half's cost per byte can be told from the
	// other's.
	Procs []ProcCPU `json:"procs,omitempty"`
}

// ProcCPU is one proxy process's share of a sample's CPU.
type ProcCPU struct {
	// Role is the process's place on the path: "client side" for the
	// first, "server side" for the last, "proxy" alone (names differ
	// between paths, roles do not).
	Role  string  `json:"role"`
	Name  string  `json:"name"`
	CPUus float64 `json:"cpu_us"`
}

// ClientPath is one path of the run.
type ClientPath struct {
	ID     string `json:"id"`
	Group  string `json:"group"`
	Daemon bool   `json:"daemon"`
	Note   string `json:"note"`
	// Clients lists the clients that run on it (iperf3 cannot speak TLS
	// or HBONE, so it has no one-hop path).
	Clients []string `json:"clients"`
}

// Clients is a zbench --clients run.
type Clients struct {
	Started  time.Time      `json:"started"`
	Finished time.Time      `json:"finished"`
	Quick    bool           `json:"quick"`
	Machine  report.Machine `json:"machine"`
	Rounds   int            `json:"rounds"`
	Count    int64          `json:"count"`
	Duration time.Duration  `json:"duration"`
	Backends []string       `json:"backends"`
	Paths    []ClientPath   `json:"paths"`
	Samples  []ClientSample `json:"samples"`
	Skipped  []report.Skip  `json:"skipped,omitempty"`
	Failures []string       `json:"failures,omitempty"`
}

// clientPath is how each client reaches one target.
type clientPath struct {
	t      *target
	py     []string // rrclient.py's connection flags
	iperf3 []string // iperf3 -c's server flags (nil: none on this path)
	// iperfProcs are the proxies iperf3's path runs through, when they
	// are not t's (HAProxy's pair in front of iperf3's server).
	iperfProcs []*proc
}

// DefaultClientsPaths are the paths zbench --clients measures unless
// --paths says otherwise: the daemons' one and two hops and HAProxy's.
var DefaultClientsPaths = regexp.MustCompile(`^hbone[12]/(ztunnel-|haproxy-tls$|haproxy-tls-captured$|haproxy-mtls-pair$|haproxy-mtls-pair-captured$)`)

// RunClients builds the lab like Run, adds iperf3 servers (and an HAProxy
// mTLS pair in front of them), then runs every client on every path in
// o.Rounds interleaved rounds.
func RunClients(ctx context.Context, o Options, co ClientsOptions) (*Clients, error) {
	if o.Paths == nil {
		o.Paths = DefaultClientsPaths
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if co.Count <= 0 {
		co.Count = 5000
		if o.Quick {
			co.Count = 200
		}
	}
	if co.Count > load.MaxCount {
		return nil, fmt.Errorf("harness: %d round trips per sample", co.Count)
	}
	cr := &Clients{Started: time.Now(), Quick: o.Quick, Machine: DescribeMachine(o.HAProxy), Rounds: o.Rounds,
		Count: co.Count, Duration: o.Duration, Backends: o.Backends}
	look := func(bin *string, name, pkg string) {
		if *bin == "" {
			*bin, _ = exec.LookPath(name)
		}
		if *bin == "" {
			cr.Skipped = append(cr.Skipped, report.Skip{What: name, Reason: fmt.Sprintf("%s is not installed (apt-get install %s; scripts/deps.sh bench does it)", name, pkg)})
		}
	}
	look(&co.Python, "python3", "python3")
	look(&co.Iperf3, "iperf3", "iperf3")
	b := &bench{o: o, start: cr.Started, run: &report.Run{}}
	err := b.setup(ctx)
	var paths []clientPath
	if err == nil {
		paths, err = b.clientPaths(ctx, co)
	}
	cr.Skipped = append(cr.Skipped, b.run.Skipped...)
	for _, p := range paths {
		cp := ClientPath{ID: p.t.cfg.ID, Group: p.t.cfg.Group, Daemon: p.t.cfg.Daemon, Note: p.t.cfg.Note}
		for _, c := range clientKinds {
			if p.runs(c, co) {
				cp.Clients = append(cp.Clients, c)
			}
		}
		cr.Paths = append(cr.Paths, cp)
	}
	if err == nil && co.Hold > 0 {
		b.logHold(paths, co)
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(co.Hold):
		}
	}
	for round := 1; err == nil && round <= o.Rounds; round++ {
		for _, c := range clientKinds {
			for _, p := range paths {
				if err = ctx.Err(); err != nil {
					break
				}
				if !p.runs(c, co) {
					continue
				}
				s, merr := b.measureClient(ctx, p, c, co, round)
				if merr != nil {
					msg := fmt.Sprintf("%s %s round %d: %v", p.t.cfg.ID, c, round, merr)
					cr.Failures = append(cr.Failures, msg)
					b.logf("FAILED %s", msg)
					continue
				}
				cr.Samples = append(cr.Samples, s)
				b.logf("round %d/%d %-12s %-26s %s", round, o.Rounds, c, p.t.cfg.ID, s.describe())
			}
		}
	}
	err = errors.Join(err, b.teardown())
	cr.Finished = time.Now()
	cr.Machine.LoadEnd = LoadAvg()
	if err == nil && o.Quick {
		err = checkClients(cr)
	}
	return cr, err
}

// runs reports whether client c has a way onto p on this machine.
func (p clientPath) runs(c string, co ClientsOptions) bool {
	switch c {
	case ClientPythonRR:
		return co.Python != "" && p.py != nil
	case ClientIperf3:
		return co.Iperf3 != "" && p.iperf3 != nil
	}
	return true
}

func (s ClientSample) describe() string {
	if s.Gbps > 0 {
		return fmt.Sprintf("%7.2f Gbit/s  %.0f µs CPU/MB  (retransmits %d)", s.Gbps, s.CPUus, s.Retransmits)
	}
	return fmt.Sprintf("%8.0f/s  p50 %.0f µs  p99 %.0f µs  %.1f µs CPU/round trip", s.PerSecond, s.P50us, s.P99us, s.CPUus)
}

// clientPaths maps the lab's targets onto the clients, starting the iperf3
// servers and the HAProxy pair in front of one.
func (b *bench) clientPaths(ctx context.Context, co ClientsOptions) ([]clientPath, error) {
	cli, srv := b.cluster.Pods[podClient], b.cluster.Pods[podServer]
	addr := func(ip netip.Addr, port int) string { return netip.AddrPortFrom(ip, uint16(port)).String() }
	iperfTo := func(ip netip.Addr, port int) []string { return []string{"-c", ip.String(), "-p", fmt.Sprint(port)} }
	var pem string
	tlsArgs := func() ([]string, error) {
		if pem == "" {
			var err error
			if pem, err = b.writeHAProxyCert(ctx, zloadSA); err != nil {
				return nil, err
			}
		}
		return []string{"--cert", pem, "--ca", b.caCert}, nil
	}
	if co.Iperf3 != "" {
		servers := []string{podServer, podPairServer}
		for _, be := range b.o.Backends {
			servers = append(servers, meshServer(be))
		}
		for _, name := range servers {
			pod := b.cluster.Pods[name]
			c, err := startChild(ctx, pod.NS, "iperf3 -s in "+name, nil, co.Iperf3, "-s", "-p", fmt.Sprint(iperfPort))
			if err != nil {
				return nil, err
			}
			b.children = append(b.children, c)
			if err := waitListening(ctx, pod.NS, fmt.Sprintf("127.0.0.1:%d", iperfPort), c, 10*time.Second); err != nil {
				return nil, err
			}
		}
	}
	var out []clientPath
	for _, t := range b.targets {
		p := clientPath{t: t}
		switch {
		case t.cfg.Direct:
			p.py = []string{"--target", addr(srv.IP, appPort)}
			p.iperf3 = iperfTo(srv.IP, iperfPort)
		case t.cfg.Group == report.GroupHBONE2 && t.cfg.Daemon:
			ms := b.cluster.Pods[meshServer(t.cfg.Backend)]
			p.py = []string{"--target", addr(ms.IP, appPort)}
			p.iperf3 = iperfTo(ms.IP, iperfPort)
		case t.cfg.Group == report.GroupHBONE1 && t.cfg.Daemon:
			ms := b.cluster.Pods[meshServer(t.cfg.Backend)]
			ta, err := tlsArgs()
			if err != nil {
				return nil, err
			}
			p.py = append([]string{"--target", addr(ms.IP, hbonePort), "--hbone", addr(ms.IP, appPort)}, ta...)
		case t.cfg.ID == report.ConfigID(report.GroupHBONE1, report.KeyHAProxyTLS):
			ta, err := tlsArgs()
			if err != nil {
				return nil, err
			}
			p.py = append([]string{"--target", addr(srv.IP, haproxyTLSPort), "--tls"}, ta...)
		case t.cfg.ID == report.ConfigID(report.GroupHBONE1, report.KeyHAProxyTLSCaptured):
			ta, err := tlsArgs()
			if err != nil {
				return nil, err
			}
			p.py = append([]string{"--target", addr(b.cluster.Pods[podTermServer].IP, hbonePort), "--tls"}, ta...)
		case t.cfg.ID == report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPairCaptured):
			// Like the daemons' pair: the client dials the server pod's
			// app, and the capture rules take it to HAProxy.
			hs := b.cluster.Pods[podPairServer]
			p.py = []string{"--target", addr(hs.IP, appPort)}
			p.iperf3 = iperfTo(hs.IP, iperfPort)
		case t.cfg.ID == report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPair):
			p.py = []string{"--target", fmt.Sprintf("127.0.0.1:%d", haproxyPairCli)}
			if co.Iperf3 != "" {
				// The same pair again, in front of iperf3's server.
				srvCrt, err := b.writeHAProxyCert(ctx, peerServerSA)
				if err != nil {
					return nil, err
				}
				cliCrt, err := b.writeHAProxyCert(ctx, peerClientSA)
				if err != nil {
					return nil, err
				}
				hs, err := b.startHAProxyTLS(ctx, srv, "haproxy (mTLS pair to iperf3, server half)", haproxyTerminate,
					fmt.Sprintf("0.0.0.0:%d", haproxyIperfPairSrv), haproxyIperfPairSrv, fmt.Sprintf("127.0.0.1:%d", iperfPort), srvCrt)
				if err != nil {
					return nil, err
				}
				hc, err := b.startHAProxyTLS(ctx, cli, "haproxy (mTLS pair to iperf3, client half)", haproxyOriginate,
					fmt.Sprintf("127.0.0.1:%d", haproxyIperfPairCli), haproxyIperfPairCli, addr(srv.IP, haproxyIperfPairSrv), cliCrt)
				if err != nil {
					return nil, err
				}
				p.iperf3 = iperfTo(netip.MustParseAddr("127.0.0.1"), haproxyIperfPairCli)
				p.iperfProcs = []*proc{hc, hs}
			}
		default:
			continue
		}
		out = append(out, p)
	}
	if co.Python != "" {
		if err := os.WriteFile(filepath.Join(b.dir, "rrclient.py"), rrClientPy, 0o644); err != nil {
			return nil, err
		}
	}
	b.logf("%d paths for the clients", len(out))
	return out, nil
}

// measureClient runs client c once on p and reads the proxies' CPU around
// it.
func (b *bench) measureClient(ctx context.Context, p clientPath, c string, co ClientsOptions, round int) (ClientSample, error) {
	s := ClientSample{Path: p.t.cfg.ID, Client: c, Round: round}
	procs := p.t.procs
	if c == ClientIperf3 && p.iperfProcs != nil {
		procs = p.iperfProcs
	}
	before, err := cpuTicksEach(procs)
	if err != nil {
		return s, err
	}
	timeout := b.o.Duration + 90*time.Second
	switch c {
	case ClientZloadRR:
		res, err := b.zload(ctx, p.t.ns, timeout, nil, append(rrArgs(co.Count, 0), p.t.args...)...)
		if err != nil {
			return s, err
		}
		if res.RR == nil || res.RR.Requests != co.Count {
			return s, fmt.Errorf("zload: %v round trips, want %d", res.RR, co.Count)
		}
		s.P50us, s.P99us, s.PerSecond, s.Seconds = res.RR.Latency.P50, res.RR.Latency.P99, res.RR.PerSecond, res.RR.Seconds
	case ClientPythonRR:
		args := append([]string{filepath.Join(b.dir, "rrclient.py"), "--count", fmt.Sprint(co.Count)}, p.py...)
		out, err := b.runIn(ctx, p, timeout, co.Python, args...)
		if err != nil {
			return s, err
		}
		r, err := parsePythonRR(out)
		if err != nil {
			return s, err
		}
		s.P50us, s.P99us, s.PerSecond, s.Seconds = r.P50, r.P99, r.PerSecond, r.Seconds
	case ClientZloadTput1:
		res, err := b.zload(ctx, p.t.ns, timeout, nil, append([]string{"throughput", "--duration", b.o.Duration.String(), "--concurrency", "1"}, p.t.args...)...)
		if err != nil {
			return s, err
		}
		if res.Throughput == nil {
			return s, errors.New("zload returned no throughput")
		}
		s.Gbps, s.Seconds = res.Throughput.Gbps, res.Throughput.Seconds
	case ClientIperf3:
		secs := max(1, int(math.Ceil(b.o.Duration.Seconds())))
		out, err := b.runIn(ctx, p, timeout, co.Iperf3, append(append([]string{}, p.iperf3...), "-t", fmt.Sprint(secs), "-J")...)
		if err != nil {
			return s, err
		}
		r, err := parseIperf3(out)
		if err != nil {
			return s, err
		}
		s.Gbps, s.Seconds, s.Retransmits = r.Gbps, r.Seconds, r.Retransmits
	}
	after, err := cpuTicksEach(procs)
	if err != nil {
		return s, err
	}
	per := 0.0 // units of work: MB moved, or round trips
	if s.Gbps > 0 {
		per = s.Gbps * 1e9 / 8 * s.Seconds / 1e6
	} else if s.PerSecond > 0 {
		per = float64(co.Count)
	}
	if per > 0 {
		for i, pr := range procs {
			us := load.CPUSeconds(after[i]-before[i]) * 1e6 / per
			s.CPUus += us
			s.Procs = append(s.Procs, ProcCPU{Role: procRole(i, len(procs)), Name: pr.name, CPUus: us})
		}
	}
	return s, nil
}

// procRole names the i-th of n proxy processes by its place on the path.
func procRole(i, n int) string {
	switch {
	case n == 1:
		return "proxy"
	case i == 0:
		return "client side"
	case i == n-1:
		return "server side"
	}
	return fmt.Sprintf("hop %d", i+1)
}

// logHold logs the command of every client on every path, for --hold.
func (b *bench) logHold(paths []clientPath, co ClientsOptions) {
	for _, p := range paths {
		ns := p.t.ns.NetNS
		var pids []string
		for _, pr := range p.t.procs {
			pids = append(pids, fmt.Sprintf("%s=%d", pr.name, pr.pid))
		}
		b.logf("hold %s: proxies %s", p.t.cfg.ID, strings.Join(pids, ", "))
		b.logf("  ip netns exec %s %s %s", ns, b.o.Zload, strings.Join(append(rrArgs(co.Count, 0), p.t.args...), " "))
		if p.py != nil {
			b.logf("  ip netns exec %s %s %s --count %d %s", ns, co.Python, filepath.Join(b.dir, "rrclient.py"), co.Count, strings.Join(p.py, " "))
		}
		if p.iperf3 != nil {
			b.logf("  ip netns exec %s %s %s -t 2", ns, co.Iperf3, strings.Join(p.iperf3, " "))
		}
	}
	b.logf("holding the lab for %s", co.Hold)
}

// runIn runs a client binary in p's client namespace and returns its
// stdout.
func (b *bench) runIn(ctx context.Context, p clientPath, timeout time.Duration, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := p.t.ns.Command(ctx, bin, args...)
	var stdout bytes.Buffer
	stderr := &tailBuffer{max: 16 << 10}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s%s", filepath.Base(bin), strings.Join(args, " "), err,
			strings.TrimSpace(stderr.String()), tail(stdout.Bytes(), 2000))
	}
	return stdout.Bytes(), nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// pythonRR is rrclient.py's output.
type pythonRR struct {
	Count     int64   `json:"count"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	load.Latency
}

func parsePythonRR(b []byte) (pythonRR, error) {
	var r pythonRR
	if err := json.Unmarshal(bytes.TrimSpace(b), &r); err != nil {
		return r, fmt.Errorf("rrclient.py output: %w", err)
	}
	if r.Count <= 0 || r.Seconds <= 0 || r.P50 <= 0 {
		return r, fmt.Errorf("rrclient.py output: no round trips: %s", bytes.TrimSpace(b))
	}
	return r, nil
}

// iperf3Result is what the run keeps of iperf3 -J's report.
type iperf3Result struct {
	Gbps        float64
	Seconds     float64
	Retransmits int64
}

// parseIperf3 reads iperf3 -J's report: what the server received (not what
// the client wrote into its socket buffer), and the sender's retransmits.
func parseIperf3(b []byte) (iperf3Result, error) {
	var j struct {
		Error string `json:"error"`
		End   struct {
			SumSent struct {
				Retransmits int64 `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				Seconds       float64 `json:"seconds"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return iperf3Result{}, fmt.Errorf("iperf3 -J output: %w", err)
	}
	if j.Error != "" {
		return iperf3Result{}, fmt.Errorf("iperf3: %s", j.Error)
	}
	r := j.End.SumReceived
	if r.BitsPerSecond <= 0 || r.Seconds <= 0 {
		return iperf3Result{}, errors.New("iperf3 -J output: nothing received")
	}
	return iperf3Result{Gbps: r.BitsPerSecond / 1e9, Seconds: r.Seconds, Retransmits: j.End.SumSent.Retransmits}, nil
}

// checkClients is the quick run's assertion: every client produced a
// figure on every path it runs on.
func checkClients(cr *Clients) error {
	var missing []string
	for _, p := range cr.Paths {
		for _, c := range p.Clients {
			if !slices.ContainsFunc(cr.Samples, func(s ClientSample) bool {
				return s.Path == p.ID && s.Client == c && (s.Gbps > 0 || s.P50us > 0)
			}) {
				missing = append(missing, p.ID+" "+c)
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("harness: the clients run produced no numbers for: %s", strings.Join(missing, ", "))
	}
	return nil
}

// WriteClients writes clients.json and CLIENTS.md to dir.
func WriteClients(dir string, cr *Clients) error {
	return writeResults(dir, ClientsFile, cr, ClientsReport, ClientsMarkdown(cr))
}

// median returns the median of v (0 if empty) and its range.
func median(v []float64) (med, lo, hi float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}

// clientFigure is the median of one client on one path, its range, and the
// proxies' median CPU.
type clientFigure struct {
	med, lo, hi, p99, cpu float64
	n                     int
}

func (cr *Clients) figure(path, client string) clientFigure {
	var v, p99, cpu []float64
	for _, s := range cr.Samples {
		if s.Path != path || s.Client != client {
			continue
		}
		if s.Gbps > 0 {
			v = append(v, s.Gbps)
		} else {
			v = append(v, s.P50us)
			p99 = append(p99, s.P99us)
		}
		cpu = append(cpu, s.CPUus)
	}
	var f clientFigure
	f.med, f.lo, f.hi = median(v)
	f.p99, _, _ = median(p99)
	f.cpu, _, _ = median(cpu)
	f.n = len(v)
	return f
}

// pairedRatio is the median over rounds of path's time-like ratio to
// peer's figure for client in the same round.
func (cr *Clients) pairedRatio(path, peer, client string) (float64, bool) {
	byRound := map[int]ClientSample{}
	for _, s := range cr.Samples {
		if s.Path == peer && s.Client == client {
			byRound[s.Round] = s
		}
	}
	var rs []float64
	for _, s := range cr.Samples {
		h, ok := byRound[s.Round]
		if s.Path != path || s.Client != client || !ok {
			continue
		}
		switch {
		case s.Gbps > 0 && h.Gbps > 0:
			rs = append(rs, h.Gbps/s.Gbps)
		case s.P50us > 0 && h.P50us > 0:
			rs = append(rs, s.P50us/h.P50us)
		}
	}
	if len(rs) == 0 {
		return 0, false
	}
	m, _, _ := median(rs)
	return m, true
}

// peerOf returns the HAProxy path a daemon path is read against.
func peerOf(group string) string {
	if group == report.GroupHBONE1 {
		return report.ConfigID(report.GroupHBONE1, report.KeyHAProxyTLS)
	}
	return report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPair)
}

// capturedPeerOf returns the HAProxy path in the daemons' places (behind
// the capture rules) a daemon path is also read against.
func capturedPeerOf(group string) string {
	if group == report.GroupHBONE1 {
		return report.ConfigID(report.GroupHBONE1, report.KeyHAProxyTLSCaptured)
	}
	return report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPairCaptured)
}

// ClientsMarkdown renders the run: one table of every client on every
// path, its ratio to the HAProxy peer of the path's group as a time-like
// ratio (latency ours/theirs, throughput theirs/ours: below 1 is ours
// better, whichever client).
func ClientsMarkdown(cr *Clients) string {
	var b strings.Builder
	b.WriteString("# Two clients, two verdicts (zbench --clients, issue 36)\n\n")
	fmt.Fprintf(&b, "%s; %d interleaved rounds; RR: %d round trips of 1 B each way on one connection per sample; "+
		"throughput: one stream for %s per sample. Load average at start %.2f %.2f %.2f, at end %.2f %.2f %.2f "+
		"(%d CPUs).\n\n", cr.Started.UTC().Format(time.RFC3339), cr.Rounds, cr.Count, cr.Duration,
		cr.Machine.LoadStart[0], cr.Machine.LoadStart[1], cr.Machine.LoadStart[2],
		cr.Machine.LoadEnd[0], cr.Machine.LoadEnd[1], cr.Machine.LoadEnd[2], cr.Machine.Cores)
	b.WriteString("Clients: **zload-rr** (Go, one goroutine, netpoller), **python-rr** (`rrclient.py`: blocking socket, " +
		"one thread), **zload-tput1** (Go, 128 KiB writes, counts what the server acknowledged), **iperf3** (one " +
		"stream, 128 KiB writes, what its server received).\n\n")
	b.WriteString("Ratio: time-like, against the group's HAProxy path (latency ours ÷ HAProxy's, throughput " +
		"HAProxy's ÷ ours): below 1.00 the daemons are better; the ratio of the medians, and the paired ratio, the " +
		"median over rounds of the ratio within each round (the two paths ran seconds apart, so load that comes and " +
		"goes between rounds cancels). The last column is the paired ratio to the same HAProxy path in the " +
		"daemons' places, behind the pods' capture rules (`haproxy-tls-captured`, `haproxy-mtls-pair-captured`): " +
		"the like-for-like peer, whose endpoints cross the same netfilter rules as the daemons'. CPU: the path's " +
		"proxy processes, per round trip (RR) or per MB (throughput), µs.\n\n")
	b.WriteString("| client | path | median | range | p99 | proxies' CPU | ratio to HAProxy | paired ratio | paired ratio, HAProxy captured |\n|---|---|---:|---|---:|---:|---:|---:|---:|\n")
	for _, c := range clientKinds {
		for _, p := range cr.Paths {
			if !slices.Contains(p.Clients, c) {
				continue
			}
			f := cr.figure(p.ID, c)
			if f.n == 0 {
				continue
			}
			unit, p99 := "µs", fmt.Sprintf("%.0f µs", f.p99)
			if c == ClientZloadTput1 || c == ClientIperf3 {
				unit, p99 = "Gbit/s", "—"
			}
			ratio, paired, captured := "—", "—", "—"
			if p.Daemon {
				if r, ok := cr.pairedRatio(p.ID, peerOf(p.Group), c); ok {
					paired = fmt.Sprintf("%.2f×", r)
				}
				if r, ok := cr.pairedRatio(p.ID, capturedPeerOf(p.Group), c); ok {
					captured = fmt.Sprintf("%.2f×", r)
				}
				if h := cr.figure(peerOf(p.Group), c); h.n > 0 && h.med > 0 && f.med > 0 {
					r := f.med / h.med
					if unit == "Gbit/s" {
						r = h.med / f.med
					}
					ratio = fmt.Sprintf("**%.2f×**", r)
				}
			}
			prec := "%.0f"
			if unit == "Gbit/s" {
				prec = "%.2f"
			}
			fmt.Fprintf(&b, "| %s | %s | "+prec+" %s | "+prec+"–"+prec+" | %s | %.1f | %s | %s | %s |\n",
				c, p.ID, f.med, unit, f.lo, f.hi, p99, f.cpu, ratio, paired, captured)
		}
	}
	b.WriteString("\n")
	for _, p := range cr.Paths {
		fmt.Fprintf(&b, "- `%s`: %s\n", p.ID, p.Note)
	}
	cr.writeProcsCPU(&b)
	if len(cr.Skipped) > 0 {
		b.WriteString("\nSkipped:\n\n")
		for _, s := range slices.SortedFunc(slices.Values(cr.Skipped), func(a, c report.Skip) int { return cmp.Compare(a.What, c.What) }) {
			fmt.Fprintf(&b, "- %s: %s\n", s.What, s.Reason)
		}
	}
	if len(cr.Failures) > 0 {
		b.WriteString("\nFailures:\n\n")
		for _, f := range cr.Failures {
			fmt.Fprintf(&b, "- %s\n", f)
		}
	}
	return b.String()
}

// writeProcsCPU writes the throughput clients' CPU per byte by process on
// the two-process paths: which half of a pair costs what (µs per MB is ms
// per GB). Median and range over the rounds, and for the daemons the
// paired ratios to the same half of the group's HAProxy pair and of the
// pair behind the capture rules (median over rounds of the ratio within
// the round).
func (cr *Clients) writeProcsCPU(b *strings.Builder) {
	header := false
	for _, c := range []string{ClientZloadTput1, ClientIperf3} {
		for _, p := range cr.Paths {
			roles, byRole := cr.procsCPU(p.ID, c)
			var peer, captured map[string]map[int]float64
			if p.Daemon {
				_, peer = cr.procsCPU(peerOf(p.Group), c)
				_, captured = cr.procsCPU(capturedPeerOf(p.Group), c)
			}
			for _, r := range roles {
				if !header {
					header = true
					b.WriteString("\nCPU per byte by process (throughput clients; ms of CPU per GB moved, " +
						"user and system; median and range over the rounds; paired ratios: to the same half of " +
						"HAProxy's pair, and of the pair behind the capture rules, median over rounds of the ratio " +
						"within the round):\n\n" +
						"| client | path | process | ms/GB | range | paired ratio to HAProxy | paired, HAProxy captured |\n|---|---|---|---:|---|---:|---:|\n")
				}
				var v []float64
				for _, us := range byRole[r] {
					v = append(v, us)
				}
				med, lo, hi := median(v)
				fmt.Fprintf(b, "| %s | %s | %s | %.0f | %.0f–%.0f | %s | %s |\n", c, p.ID, r, med, lo, hi,
					pairedByRound(byRole[r], peer[r]), pairedByRound(byRole[r], captured[r]))
			}
		}
	}
}

// pairedByRound is the median over the rounds both have of ours/theirs,
// formatted, or "—".
func pairedByRound(ours, theirs map[int]float64) string {
	var rs []float64
	for round, us := range ours {
		if h := theirs[round]; h > 0 {
			rs = append(rs, us/h)
		}
	}
	if len(rs) == 0 {
		return "—"
	}
	m, _, _ := median(rs)
	return fmt.Sprintf("%.2f×", m)
}

// procsCPU returns client's CPU per unit by process role on path, by
// round, and the roles in path order; single-process paths have none.
func (cr *Clients) procsCPU(path, client string) ([]string, map[string]map[int]float64) {
	var roles []string
	byRole := map[string]map[int]float64{}
	for _, s := range cr.Samples {
		if s.Path != path || s.Client != client || len(s.Procs) < 2 {
			continue
		}
		for _, pc := range s.Procs {
			if byRole[pc.Role] == nil {
				roles = append(roles, pc.Role)
				byRole[pc.Role] = map[int]float64{}
			}
			byRole[pc.Role][s.Round] = pc.CPUus
		}
	}
	return roles, byRole
}
