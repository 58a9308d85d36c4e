package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/proxy/connmgr"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

// The idle-memory harness runs each proxy of a pair in a process of its
// own (this test binary, re-executed), so that each side's heap is measured
// alone: the client-side proxy takes connections over SOCKS5 (the outbound
// path after SO_ORIGINAL_DST) and carries them over HBONE to the
// server-side proxy on 127.0.9.3:15008, which dials the echo app in the
// test process; or, for passthrough, relays them TCP to TCP to an app that
// is no workload. The parent talks to each helper over its stdin/stdout.

// idleHelperEnv makes the test binary an idle-memory helper proxy; its
// value is "client" or "server".
const idleHelperEnv = "ZTUNNEL_PROXY_IDLE_HELPER"

// Addresses of the idle-memory pair on loopback.
const (
	idleClientIP = "127.0.9.2"
	idleServerIP = "127.0.9.3" // an HBONE workload: its proxy takes 15008 there
	idlePlainIP  = "127.0.9.4" // no workload: outbound passthrough
)

const idleConfig = `
workloads:
- {uid: u-cli, name: cli, namespace: ns, serviceAccount: cli, workloadIps: ["127.0.9.2"], protocol: HBONE, services: {}}
- {uid: u-srv, name: srv, namespace: ns, serviceAccount: srv, workloadIps: ["127.0.9.3"], protocol: HBONE, services: {}}
`

// runIdleHelper serves one proxy of the pair until its stdin closes. It
// answers each command line on stdin with one line on stdout:
//
//	mem           -> "heapalloc heapinuse goroutines fds" after two GCs
//	profile PATH  -> "ok" once the heap profile is written to PATH
func runIdleHelper(role string) int {
	if os.Getenv("ZTUNNEL_IDLE_MEMPROFILE") != "" {
		runtime.MemProfileRate = 1
	}
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "idle helper:", err); return 1 }
	ca, err := caclient.LoadBuiltinCA([]byte(os.Getenv("ZTUNNEL_IDLE_CA_CERT")), []byte(os.Getenv("ZTUNNEL_IDLE_CA_KEY")))
	if err != nil {
		return fail(err)
	}
	snap, err := xdsconv.LocalSnapshot([]byte(idleConfig))
	if err != nil {
		return fail(err)
	}
	ports := strings.Fields(os.Getenv("ZTUNNEL_IDLE_PORTS")) // outbound, plaintext, socks5
	port := func(i int) int { n, _ := strconv.Atoi(ports[i]); return n }
	store := state.NewStore(snap)
	certs := mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: ca})})
	defer certs.Close()
	pool := hbone.NewPool(hbone.PoolConfig{})
	defer pool.Close()
	// As the daemon: connection manager, metrics, an access log at INFO.
	conns := connmgr.New(connmgr.Config{Store: store})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { conns.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	cfg := Config{
		State: store, Certs: certs, Pool: pool, Conns: conns,
		Metrics: metrics.New(metrics.Config{}), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OutboundPort: port(0), InboundPlainPort: port(1), SOCKS5Port: port(2), InboundHBONEPort: InboundHBONEPort,
		OrigSrc: new(bool),
	}
	switch role {
	case "client":
		cfg.Workload = WorkloadRef{Namespace: "ns", Name: "cli", ServiceAccount: "cli"}
		cfg.BindHost, cfg.SOCKS5 = idleClientIP, true
	case "server":
		cfg.Workload = WorkloadRef{Namespace: "ns", Name: "srv", ServiceAccount: "srv"}
		cfg.BindHost = idleServerIP
	default:
		return fail(fmt.Errorf("unknown role %q", role))
	}
	p, err := New(cfg)
	if err != nil {
		return fail(err)
	}
	if err := p.Start(context.Background()); err != nil {
		return fail(err)
	}
	defer p.Close()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "mem":
			runtime.GC()
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			fds, _ := os.ReadDir("/proc/self/fd")
			fmt.Println(ms.HeapAlloc, ms.HeapInuse, runtime.NumGoroutine(), len(fds))
		case "profile":
			runtime.GC()
			f, err := os.Create(arg)
			if err == nil {
				err = pprof.Lookup("heap").WriteTo(f, 0)
				f.Close()
			}
			fmt.Println("ok", err)
		default:
			fmt.Println("unknown command")
		}
	}
	return 0
}

// idleHelper is a running helper proxy.
type idleHelper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	socks int
}

// idleSample is one helper's reading.
type idleSample struct {
	heapAlloc, heapInuse uint64
	goroutines, fds      int
}

func startIdleHelper(b *testing.B, role string, ca *caclient.BuiltinCA, profile bool) *idleHelper {
	b.Helper()
	h := &idleHelper{socks: freePort(b)}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), idleHelperEnv+"="+role,
		"ZTUNNEL_IDLE_CA_CERT="+string(ca.RootPEM()), "ZTUNNEL_IDLE_CA_KEY="+string(ca.KeyPEM()),
		fmt.Sprintf("ZTUNNEL_IDLE_PORTS=%d %d %d", freePort(b), freePort(b), h.socks))
	if profile {
		cmd.Env = append(cmd.Env, "ZTUNNEL_IDLE_MEMPROFILE=1")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	var err error
	if h.stdin, err = cmd.StdinPipe(); err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	h.cmd, h.out = cmd, bufio.NewReader(stdout)
	b.Cleanup(func() {
		h.stdin.Close()
		h.cmd.Wait()
	})
	if line := h.line(b); line != "ready" {
		b.Fatalf("%s helper: %q", role, line)
	}
	return h
}

func (h *idleHelper) line(b *testing.B) string {
	b.Helper()
	s, err := h.out.ReadString('\n')
	if err != nil {
		b.Fatalf("helper: %v", err)
	}
	return strings.TrimSpace(s)
}

func (h *idleHelper) sample(b *testing.B) idleSample {
	b.Helper()
	fmt.Fprintln(h.stdin, "mem")
	var s idleSample
	if _, err := fmt.Sscan(h.line(b), &s.heapAlloc, &s.heapInuse, &s.goroutines, &s.fds); err != nil {
		b.Fatal(err)
	}
	return s
}

func (h *idleHelper) profile(b *testing.B, path string) {
	b.Helper()
	fmt.Fprintln(h.stdin, "profile "+path)
	if line := h.line(b); line != "ok <nil>" {
		b.Fatalf("profile: %s", line)
	}
}

// idleApp accepts on ip and echoes every connection; its conns are closed
// at cleanup.
func idleApp(b *testing.B, ip string) netip.AddrPort {
	b.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, make([]byte, 64))
			})
		}
	})
	b.Cleanup(func() { ln.Close(); wg.Wait() })
	return netip.MustParseAddrPort(ln.Addr().String())
}

// BenchmarkIdleConnMemory opens ZTUNNEL_IDLE_CONNS (default 2000)
// connections through a proxy pair, exchanges one byte on each, and with
// all of them held idle reports each side's live heap per connection
// (after GC) and goroutines and descriptors per connection. Paths: "hbone"
// (client proxy -> HBONE -> server proxy -> app) and "passthrough" (client
// proxy -> plain TCP -> app; the server proxy is idle). With
// ZTUNNEL_IDLE_PROFILE=DIR each side writes DIR/<path>-<side>.heap, a heap
// profile recorded with runtime.MemProfileRate=1 (exact sites; go tool
// pprof -sample_index=inuse_space). It runs once per path whatever b.N:
//
//	go test -run '^$' -bench IdleConnMemory -benchtime 1x ./proxy/
func BenchmarkIdleConnMemory(b *testing.B) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("ZTUNNEL_IDLE_CONNS")); err == nil && v > 0 {
		n = v
	}
	raiseNoFileLimit(b, uint64(3*n+256))
	profDir := os.Getenv("ZTUNNEL_IDLE_PROFILE")
	for _, path := range []struct{ name, appIP string }{{"hbone", idleServerIP}, {"passthrough", idlePlainIP}} {
		b.Run(path.name, func(b *testing.B) {
			ca, err := caclient.NewBuiltinCA("cluster.local")
			if err != nil {
				b.Fatal(err)
			}
			client := startIdleHelper(b, "client", ca, profDir != "")
			server := startIdleHelper(b, "server", ca, profDir != "")
			app := idleApp(b, path.appIP)
			var conns []net.Conn
			b.Cleanup(func() {
				for _, c := range conns {
					c.Close()
				}
			})
			open := func() {
				c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", client.socks))
				if err != nil {
					b.Fatal(err)
				}
				conns = append(conns, c)
				c.SetDeadline(time.Now().Add(30 * time.Second))
				if rep, err := socks5.ClientHandshake(c, socks5.Target{Addr: app}); err != nil || rep != socks5.ReplySucceeded {
					b.Fatalf("socks5: %v %v", rep, err)
				}
				buf := []byte{1}
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
			// Warm up: certificates, the first pooled HBONE connection,
			// the workers; the baseline is what a daemon holds at rest.
			open()
			conns[0].Close()
			conns = conns[:0]
			time.Sleep(200 * time.Millisecond)
			c0, s0 := client.sample(b), server.sample(b)
			b.ResetTimer()
			for range n {
				open()
			}
			b.StopTimer()
			time.Sleep(200 * time.Millisecond) // relays settle (buffers returned)
			c1, s1 := client.sample(b), server.sample(b)
			if profDir != "" {
				client.profile(b, fmt.Sprintf("%s/%s-client.heap", profDir, path.name))
				server.profile(b, fmt.Sprintf("%s/%s-server.heap", profDir, path.name))
			}
			per := func(a, z uint64) float64 { return (float64(z) - float64(a)) / float64(n) }
			b.ReportMetric(per(c0.heapAlloc, c1.heapAlloc), "client-heap-B/conn")
			b.ReportMetric(per(c0.heapInuse, c1.heapInuse), "client-inuse-B/conn")
			b.ReportMetric(per(s0.heapAlloc, s1.heapAlloc), "server-heap-B/conn")
			b.ReportMetric(per(s0.heapInuse, s1.heapInuse), "server-inuse-B/conn")
			b.ReportMetric(float64(c1.goroutines-c0.goroutines)/float64(n), "client-goroutines/conn")
			b.ReportMetric(float64(s1.goroutines-s0.goroutines)/float64(n), "server-goroutines/conn")
			b.ReportMetric(float64(c1.fds-c0.fds)/float64(n), "client-fds/conn")
			b.ReportMetric(float64(s1.fds-s0.fds)/float64(n), "server-fds/conn")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// raiseNoFileLimit lifts the soft descriptor limit to need (helpers
// inherit it), or skips when the hard limit is lower.
func raiseNoFileLimit(b *testing.B, need uint64) {
	b.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	if lim.Cur >= need {
		return
	}
	if lim.Max < need {
		b.Skipf("descriptor limit %d < %d needed", lim.Max, need)
	}
	lim.Cur = need
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
}
