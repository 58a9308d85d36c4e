// Command zload is the project's load generator: throughput, request/response
// latency, connection rate and idle-connection cost, over plain TCP, TLS or
// HBONE, plus the matching echo/sink server. It is a thin command line over
// package bench/load; the bench harness runs it inside lab namespaces
// (ip netns exec) with --json, and a human can run it anywhere.
//
// Usage:
//
//	zload server     --listen :8080 --duration 1h
//	zload throughput --target 10.244.1.2:8080 --duration 10s --concurrency 4
//	zload rr         --target 10.244.1.2:8080 --duration 10s --req-size 1 --resp-size 1
//	zload rr         --target 10.244.1.2:8080 --duration 10s --open-rate 1000 --concurrency 10 --req-size 1024 --resp-size 1024
//	zload cps        --target 10.244.1.2:8080 --count 100000 --concurrency 4
//	zload idle       --target 10.244.1.2:8080 --count 5000 --steps 5 --final-settle 30s --pid 1234
//	zload rr --hbone --target 10.244.1.2:15008 --authority 10.244.1.2:8080 \
//	    --ca-cert ca-cert.pem --ca-key ca-key.pem --identity spiffe://cluster.local/ns/a/sa/b \
//	    --san spiffe://cluster.local/ns/default/sa/server --duration 5s
//
// Every run needs a duration or a count; see bench/load for the maximums.
// Progress goes to stderr when stdout is a terminal.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
)

func main() {
	tty := isTerminal(os.Stdout) && isTerminal(os.Stderr)
	load.Main("zload", func(ctx context.Context, args []string) error {
		return run(ctx, args, os.Stdout, os.Stderr, tty)
	})
}

const usage = `usage: zload <mode> [flags]

modes:
  throughput  N streams write to a sink for a duration; Gbit/s acknowledged by the server
  rr          request/response latency (closed loop, --rate, or open loop with --open-rate); p50/p90/p99/p99.9/max
  cps         a new connection per request; connections per second
  idle        open and hold --count connections; RSS, fds, goroutines per connection of --pid
  server      the echo/sink server the other modes talk to

run "zload <mode> -h" for a mode's flags.
`

type intList []int

func (s *intList) String() string { return fmt.Sprint(*s) }
func (s *intList) Set(v string) error {
	var n int
	if _, err := fmt.Sscan(v, &n); err != nil || n <= 0 {
		return fmt.Errorf("not a pid: %q", v)
	}
	*s = append(*s, n)
	return nil
}

// flags holds every mode's flags; each mode registers the ones it uses.
type flags struct {
	target, listen, authority string
	duration, timeout, hold   time.Duration
	settle, finalSettle       time.Duration
	count                     int64
	concurrency, steps        int
	size, reqSize, respSize   int
	rate, openRate            float64
	maxInFlight               int
	prime                     bool
	hbone, tls, raw, json     bool
	streamsPerConn            int
	cert                      load.CertConfig
	sans                      load.StringList
	pids                      intList
	goroutineURLs             load.StringList
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, tty bool) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		return flag.ErrHelp
	}
	mode := args[0]
	fs := flag.NewFlagSet("zload "+mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f flags
	client := func() {
		fs.StringVar(&f.target, "target", "", "address to connect to (host:port; for --hbone the peer's 15008)")
		fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound on each dial and each transaction")
		fs.BoolVar(&f.raw, "raw", false, "send no zload header (talk to any echo server; throughput counts written bytes)")
		fs.BoolVar(&f.hbone, "hbone", false, "tunnel every connection as an HBONE CONNECT stream (mTLS + HTTP/2)")
		fs.BoolVar(&f.tls, "tls", false, "wrap every connection in mutual TLS 1.3 (no HTTP/2)")
		fs.StringVar(&f.authority, "authority", "", "HBONE CONNECT target ip:port (required with --hbone)")
		fs.IntVar(&f.streamsPerConn, "streams-per-conn", 0, "HBONE streams per pooled connection (default 100)")
		fs.StringVar(&f.cert.CACert, "ca-cert", "", "PEM root of the mesh CA (tls, hbone)")
		fs.StringVar(&f.cert.CAKey, "ca-key", "", "PEM key of the mesh CA: issue our own certificate for --identity")
		fs.StringVar(&f.cert.CertFile, "cert", "", "PEM certificate chain (instead of --ca-key)")
		fs.StringVar(&f.cert.KeyFile, "key", "", "PEM private key for --cert")
		fs.StringVar(&f.cert.Identity, "identity", "", "our SPIFFE identity (spiffe://td/ns/N/sa/S)")
		fs.Var(&f.sans, "san", "expected server SPIFFE identity (repeatable)")
		fs.BoolVar(&f.json, "json", false, "print the result as JSON")
	}
	bounded := func() {
		fs.DurationVar(&f.duration, "duration", 0, "run for this long (a duration or a count is required)")
	}
	switch mode {
	case "throughput":
		client()
		bounded()
		fs.IntVar(&f.concurrency, "concurrency", 1, "parallel streams")
		fs.IntVar(&f.size, "size", 128<<10, "bytes per write")
	case "rr", "cps":
		client()
		bounded()
		fs.Int64Var(&f.count, "count", 0, "stop after this many transactions")
		fs.IntVar(&f.concurrency, "concurrency", 1, "parallel workers (rr: one connection each)")
		fs.IntVar(&f.reqSize, "req-size", 1, "request bytes")
		fs.IntVar(&f.respSize, "resp-size", 1, "response bytes")
		fs.Float64Var(&f.rate, "rate", 0, "total transactions per second (0: closed loop)")
		if mode == "rr" {
			fs.Float64Var(&f.openRate, "open-rate", 0, "open loop: total requests per second on a fixed schedule, pipelined, latency from the schedule (excludes --rate)")
			fs.BoolVar(&f.prime, "prime", false, "open loop: one round trip on each connection before the schedule starts (not counted)")
			fs.IntVar(&f.maxInFlight, "max-in-flight", 0, fmt.Sprintf("open loop: unanswered requests per connection before the writer waits (default %d)", load.DefaultMaxInFlight))
		}
	case "idle":
		client()
		fs.Int64Var(&f.count, "count", 0, "connections to open and hold (required)")
		fs.IntVar(&f.steps, "steps", 1, "sample after each of this many equal steps")
		fs.IntVar(&f.concurrency, "concurrency", 32, "dials in flight while opening")
		fs.Var(&f.pids, "pid", "process to measure: RSS, fds (repeatable)")
		fs.Var(&f.goroutineURLs, "goroutines-url", "pprof goroutine URL (…/debug/pprof/goroutine?debug=1) to sample (repeatable)")
		fs.DurationVar(&f.settle, "settle", 300*time.Millisecond, "pause before each sample")
		fs.DurationVar(&f.finalSettle, "final-settle", 0, "pause before the last sample instead, if longer than --settle (issue 23 reads idle RSS 30s after the connections opened)")
		fs.DurationVar(&f.hold, "hold", 0, "keep the connections open this long after the last sample")
	case "server":
		fs.StringVar(&f.listen, "listen", ":8080", "address to listen on")
		fs.BoolVar(&f.raw, "raw", false, "plain echo, no zload header")
		bounded()
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown mode %q", mode)
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var report func(string)
	if tty {
		report = func(line string) { fmt.Fprintf(stderr, "\r\033[K%s", line) }
	}
	if mode == "server" {
		return serve(ctx, f, stderr)
	}

	d, err := newDialer(ctx, f)
	if err != nil {
		return err
	}
	defer d.Close()
	res := &load.Result{Mode: mode, Target: d.String(), Started: time.Now()}
	switch mode {
	case "throughput":
		res.Throughput, err = load.Throughput(ctx, load.ThroughputConfig{
			Dialer: d, Duration: f.duration, Concurrency: f.concurrency, WriteSize: f.size, Raw: f.raw, Progress: report,
		})
	case "rr", "cps":
		cfg := load.RRConfig{
			Dialer: d, Bounds: load.Bounds{Duration: f.duration, Count: f.count}, Concurrency: f.concurrency,
			ReqSize: f.reqSize, RespSize: f.respSize, Rate: f.rate, OpenRate: f.openRate, MaxInFlight: f.maxInFlight,
			Prime: f.prime, Raw: f.raw, Progress: report,
		}
		if f.openRate > 0 {
			cfg.OnStart = func(n int) {
				// The harness's Load scenario waits for this exact line
				// before it opens its measurement window.
				fmt.Fprintf(stderr, "zload: schedule started, %d connections\n", n)
			}
		}
		if mode == "rr" {
			res.RR, err = load.RR(ctx, cfg)
		} else {
			res.CPS, err = load.CPS(ctx, cfg)
		}
	case "idle":
		res.Idle, err = load.Idle(ctx, load.IdleConfig{
			Dialer: d, Count: int(f.count), Steps: f.steps, Concurrency: f.concurrency,
			Pids: f.pids, GoroutineURLs: f.goroutineURLs, Settle: f.settle, FinalSettle: f.finalSettle, Hold: f.hold, Raw: f.raw,
			Progress: report,
			OnHold: func(n int) {
				// The harness waits for this exact line before measuring.
				fmt.Fprintf(stderr, "zload: holding %d connections\n", n)
			},
		})
	}
	if tty {
		fmt.Fprint(stderr, "\r\033[K") // clear the progress line
	}
	if err != nil {
		return err
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	printText(stdout, res)
	return nil
}

func newDialer(ctx context.Context, f flags) (*load.Dialer, error) {
	cfg := load.DialConfig{Target: f.target, Authority: f.authority, SANs: f.sans, Timeout: f.timeout, StreamsPerConn: f.streamsPerConn}
	switch {
	case f.hbone && f.tls:
		return nil, errors.New("--hbone and --tls exclude each other")
	case f.hbone:
		cfg.Transport = load.HBONE
	case f.tls:
		cfg.Transport = load.TLS
	default:
		cfg.Transport = load.TCP
		if f.cert.Enabled() {
			return nil, errors.New("certificate flags need --tls or --hbone")
		}
	}
	if cfg.Transport != load.TCP {
		cert, err := load.LoadCert(ctx, f.cert)
		if err != nil {
			return nil, err
		}
		cfg.Cert = cert
	}
	return load.NewDialer(cfg)
}

func serve(ctx context.Context, f flags, stderr io.Writer) error {
	if err := (load.Bounds{Duration: f.duration}).Validate(); err != nil {
		return fmt.Errorf("server: %w (the server exits after --duration)", err)
	}
	ctx, cancel := context.WithTimeout(ctx, f.duration)
	defer cancel()
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "zload: serving on %s for %v\n", ln.Addr(), f.duration)
	return load.NewServer(load.ServerConfig{Raw: f.raw}).Serve(ctx, ln)
}

func printText(w io.Writer, r *load.Result) {
	fmt.Fprintf(w, "%s to %s\n", r.Mode, r.Target)
	switch {
	case r.Throughput != nil:
		t := r.Throughput
		fmt.Fprintf(w, "  %d streams, %.1f MiB in %.2fs: %.2f Gbit/s", t.Streams, float64(t.Bytes)/(1<<20), t.Seconds, t.Gbps)
		if !t.Acked {
			fmt.Fprint(w, " (written, not acknowledged)")
		}
		fmt.Fprintln(w)
	case r.RR != nil, r.CPS != nil:
		x, unit := r.RR, "transactions"
		if x == nil {
			x, unit = r.CPS, "connections"
		}
		fmt.Fprintf(w, "  %d %s (%d B / %d B, concurrency %d) in %.2fs: %.0f/s, %d errors\n",
			x.Requests, unit, x.ReqSize, x.RespSize, x.Concurrency, x.Seconds, x.PerSecond, x.Errors)
		if x.OpenRate > 0 {
			fmt.Fprintf(w, "  open loop at %.0f/s: %d sent, %d missed, %d unanswered\n", x.OpenRate, x.Sent, x.Missed, x.Unanswered)
		}
		printLatency(w, "latency µs", x.Latency)
		if x.SendLag != nil {
			printLatency(w, "send lag µs", *x.SendLag)
		}
		if x.FirstError != "" {
			fmt.Fprintf(w, "  first error: %s\n", x.FirstError)
		}
	case r.Idle != nil:
		id := r.Idle
		fmt.Fprintf(w, "  %d idle connections\n", id.Connections)
		for _, s := range id.Samples {
			fmt.Fprintf(w, "  %6d conns (read %v after):", s.Conns, s.Settle)
			for _, p := range s.Procs {
				fmt.Fprintf(w, "  pid %d rss %d KiB fds %d", p.Pid, p.RSSKiB, p.FDs)
			}
			for i, g := range s.Goroutines {
				fmt.Fprintf(w, "  goroutines[%d] %d", i, g)
			}
			fmt.Fprintln(w)
		}
		for _, p := range id.PerConn {
			fmt.Fprintf(w, "  per connection, pid %d: %.2f KiB RSS, %.2f fds\n", p.Pid, p.RSSKiB, p.FDs)
		}
		for i, g := range id.GoroutinesPerConn {
			fmt.Fprintf(w, "  per connection, goroutines[%d]: %.2f\n", i, g)
		}
	}
}

func printLatency(w io.Writer, what string, l load.Latency) {
	fmt.Fprintf(w, "  %s: p50 %.0f  p90 %.0f  p99 %.0f  p99.9 %.0f  max %.0f  mean %.1f\n", what, l.P50, l.P90, l.P99, l.P999, l.Max, l.Mean)
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
