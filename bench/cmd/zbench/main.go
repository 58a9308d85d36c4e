// Command zbench runs the end-to-end benchmarks (package bench/harness) and
// writes the report (package bench/report): `make bench` for the full run,
// `make bench-quick` for the CI smoke run. It must run as root: it builds
// network namespaces.
//
//	zbench [--quick] [--out DIR] [--rounds N] [--duration D] [--backends std,epoll,uring]
//	zbench --syscalls N [--paths RE] [--backends B]   (the round-trip census)
//	zbench --clients [--quick] [--rounds N] [--clients-count N] [--paths RE] [--backends B]   (issue 36's two clients)
//	zbench --load [--quick] [--load-conns 1000,5000,8000] [--load-rate R]   (issue 36's Load scenario)
//
// The binaries default to ztunnel, zload and zpeer next to zbench itself.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/harness"
	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/bench/report"
)

func main() { load.Main("zbench", run) }

func run(ctx context.Context, args []string) error {
	self, _ := os.Executable()
	binDir := filepath.Dir(self)
	fs := flag.NewFlagSet("zbench", flag.ContinueOnError)
	var (
		o        harness.Options
		out      string
		backends string
		paths    string
		timeout  time.Duration
		census   int64
		loadRun  bool
		lo       harness.LoadOptions
		levels   string
		clients  bool
		co       harness.ClientsOptions
	)
	fs.BoolVar(&o.Quick, "quick", false, "CI smoke run: one short round, checks only that every path produced numbers")
	fs.StringVar(&out, "out", "", "report directory (default bench/results/<date>-<host>; quick: a temporary directory)")
	fs.IntVar(&o.Rounds, "rounds", 0, "rounds per measurement (default 3, quick 1)")
	fs.DurationVar(&o.Duration, "duration", 0, "length of each measurement (default 2s, quick 500ms)")
	fs.IntVar(&o.Streams, "streams", 0, "streams of the N-stream throughput (default 8, quick 4)")
	fs.IntVar(&o.IdleConns, "idle-conns", 0, "idle connections to hold (default 2000, quick 100; issue 23 reads its idle goal at 5000: --idle-conns 5000 --paths hbone2/)")
	fs.DurationVar(&o.IdleSettle, "idle-settle", 0, "wait after the idle ramp's last step before its final reading (default 30s, issue 23's; quick 1s)")
	fs.IntVar(&o.FixedRate.Rate, "fixed-rate", 0, "requests/s of the fixed-rate CPU measurement, open loop (default 1000)")
	fs.IntVar(&o.FixedRate.Conns, "fixed-conns", 0, "connections of the fixed-rate measurement (default 10)")
	fs.IntVar(&o.FixedRate.Size, "fixed-size", 0, "request and response bytes of the fixed-rate measurement (default 1024)")
	fs.StringVar(&backends, "backends", "", "daemon engine backends, comma-separated (ZTUNNEL_ENGINE; default std,epoll,uring, quick epoll); NAME=ENGINE[@BINARY][+VAR=value...] runs\nthe daemons of backend NAME with that engine, binary and environment (A/B runs: 'old=epoll@/tmp/ztunnel.old,new=epoll')")
	fs.StringVar(&paths, "paths", "", "measure only the paths whose ID matches this regexp (e.g. 'hbone2/'; direct is always kept)")
	fs.StringVar(&o.DaemonLogLevel, "daemon-log-level", "", "daemons' RUST_LOG (default warn)")
	fs.StringVar(&o.Ztunnel, "ztunnel", filepath.Join(binDir, "ztunnel"), "daemon binary")
	fs.StringVar(&o.Zload, "zload", filepath.Join(binDir, "zload"), "load generator binary")
	fs.StringVar(&o.Zpeer, "zpeer", filepath.Join(binDir, "zpeer"), "peer proxies binary")
	fs.StringVar(&o.HAProxy, "haproxy", "", `haproxy binary (default: from PATH; "-" skips HAProxy)`)
	fs.Int64Var(&census, "syscalls", 0, "instead of the measurements, take the round-trip census: N 1-byte round trips per path, untraced (context switches)\nand under strace -c -f (syscalls by kind), plus the daemons' CPU profile and Go execution trace; writes "+harness.CensusReport)
	fs.StringVar(&o.Prefix, "prefix", "", "the lab's namespace prefix (default zl-bench; its stale namespaces are removed first, so two runs at once need two)")
	fs.DurationVar(&timeout, "timeout", 45*time.Minute, "abort the whole run after this long (a full run takes about 30 minutes, some 12 of them the idle ramps' 30 s settles)")
	fs.BoolVar(&loadRun, "load", false, "instead of the measurements, run issue 36's Load scenario: many connections at a fixed aggregate rate through the\ndaemon pair and the HAProxy mTLS pair; writes "+report.FileLoadReport+" (default directory bench/results/<date>-<host>-load)")
	fs.StringVar(&levels, "load-conns", "", "the Load scenario's levels of concurrency, comma-separated (default 1000,5000,8000; quick 200)")
	fs.IntVar(&lo.Rate, "load-rate", 0, "the Load scenario's aggregate requests/s (default 10000; quick 2000)")
	fs.IntVar(&lo.Rounds, "load-rounds", 0, "the Load scenario's rounds per level and path, the paths taking turns (default 3; quick 1)")
	fs.IntVar(&lo.Size, "load-size", 0, "the Load scenario's request and response bytes (default 64)")
	fs.DurationVar(&lo.Window, "load-window", 0, "the Load scenario's CPU and GC window per level (default 10s; quick 2s)")
	fs.IntVar(&lo.ProfileConns, "load-profile", 0, "the level at which the Load scenario profiles the daemons (default 5000; quick none; -1 none)")
	fs.BoolVar(&clients, "clients", false, "instead of the measurements, run every client on the daemons' and HAProxy's one- and two-hop paths (default --paths "+
		harness.DefaultClientsPaths.String()+"):\nzload's RR and one stream, a blocking Python RR client (python3) and iperf3 (one stream), rounds interleaved; writes "+harness.ClientsReport+
		"\n(default directory bench/results/<date>-<host>-clients)")
	fs.DurationVar(&co.Hold, "clients-hold", 0, "with --clients: keep the lab up this long before the rounds, logging each client's command on each path (to profile one by hand)")
	fs.Int64Var(&co.Count, "clients-count", 0, "round trips of each RR sample of --clients (default 5000; quick 200)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, f := range strings.Split(levels, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n > load.MaxConcurrency {
			return fmt.Errorf("--load-conns: %q is not a level in [1, %d]", f, load.MaxConcurrency)
		}
		lo.Conns = append(lo.Conns, n)
	}
	if backends == "" {
		// The full run compares every backend, as issue 4 asks; the CI
		// smoke run and the Load scenario take the daemon's default one.
		backends = "std,epoll,uring"
		if o.Quick || loadRun || clients {
			backends = "epoll"
		}
	}
	o.Backends = nil
	for _, be := range strings.Split(backends, ",") {
		name, spec, ok := strings.Cut(be, "=")
		if ok {
			v, err := harness.ParseVariant(spec)
			if err != nil {
				return err
			}
			if o.Variants == nil {
				o.Variants = map[string]harness.Variant{}
			}
			o.Variants[name] = v
		}
		o.Backends = append(o.Backends, name)
	}
	if paths != "" {
		re, err := regexp.Compile(paths)
		if err != nil {
			return fmt.Errorf("--paths: %w", err)
		}
		o.Paths = re
	}
	if out == "" {
		if o.Quick {
			dir, err := os.MkdirTemp("", "zbench-quick-")
			if err != nil {
				return err
			}
			out = dir
		} else {
			host, _ := os.Hostname()
			out = filepath.Join("bench", "results", time.Now().Format("2006-01-02")+"-"+host)
			if loadRun {
				out += "-load"
			}
			if clients {
				out += "-clients"
			}
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	o.OutDir = out
	o.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if loadRun {
		l, err := harness.RunLoad(ctx, o, lo)
		if l != nil && len(l.Points) > 0 {
			if werr := report.WriteLoad(out, l); werr != nil {
				err = errors.Join(err, werr)
			} else {
				fmt.Fprintf(os.Stderr, "load: %s\n", filepath.Join(out, report.FileLoadReport))
			}
		}
		return err
	}
	if clients {
		cr, err := harness.RunClients(ctx, o, co)
		if cr != nil && len(cr.Samples) > 0 {
			if werr := harness.WriteClients(out, cr); werr != nil {
				err = errors.Join(err, werr)
			} else {
				fmt.Fprintf(os.Stderr, "clients: %s\n", filepath.Join(out, harness.ClientsReport))
			}
		}
		return err
	}
	if census > 0 {
		cs, err := harness.RunCensus(ctx, o, census)
		if len(cs) > 0 {
			if werr := harness.WriteCensus(out, cs); werr != nil {
				err = errors.Join(err, werr)
			} else {
				fmt.Fprintf(os.Stderr, "census: %s\n", filepath.Join(out, harness.CensusReport))
			}
		}
		return err
	}
	run, err := harness.Run(ctx, o)
	if run != nil && (err == nil || len(run.Samples) > 0) {
		if werr := report.Write(out, run); werr != nil {
			err = errors.Join(err, werr)
		} else {
			fmt.Fprintf(os.Stderr, "report: %s\n", filepath.Join(out, report.FileReport))
		}
	}
	return err
}
