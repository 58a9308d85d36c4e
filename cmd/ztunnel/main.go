// Command ztunnel is the ztunnel-go node proxy daemon. It takes the same
// arguments and environment variables as Istio's ztunnel: `ztunnel proxy
// ztunnel` (only the first argument matters), `ztunnel version` (or
// `--version`, `-V`).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ztunnel-go/ztunnel/internal/app"
)

func main() {
	os.Exit(run(os.Args, os.Stderr))
}

func run(args []string, stderr *os.File) int {
	cmd := ""
	if len(args) > 1 {
		cmd = args[1]
	}
	switch cmd {
	case "", "proxy":
	case "version", "--version", "-V":
		fmt.Println(app.Version())
		return 0
	case "help", "-h", "--help":
		fmt.Fprintf(stderr, "ztunnel-go %s\n\nCommands:\nproxy (default) - Start the proxy\nversion         - Print the version (also --version, -V)\nhelp            - Print commands and version\n", app.Version())
		return 0
	default:
		fmt.Fprintf(stderr, "ztunnel: unknown command %q (want proxy, version or help)\n", cmd)
		return 2
	}
	cfg, err := app.ParseEnv(os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "ztunnel: invalid configuration:\n%v\n", err)
		return 1
	}
	app.RaiseFileLimit()
	// Before any goroutine makes sockets: growing the descriptor table
	// later stalls the call that crosses each doubling.
	fdSlots := app.GrowFDTable()
	// A GC target for a proxy unless the operator set GOGC/GOMEMLIMIT.
	gc := app.TuneGC(os.LookupEnv, "/")
	// ztunnel logs to stdout.
	log, levels, err := app.NewLogger(os.Stdout, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "ztunnel: %v\n", err)
		return 1
	}
	procs := app.ApplyWorkerThreads(cfg, os.LookupEnv)
	from := cfg.WorkerThreadsFrom
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		from = "GOMAXPROCS"
	}
	log.Info("worker threads", "gomaxprocs", procs, "from", from)
	log.Info("descriptor table sized", "slots", fdSlots)
	if gc != (app.GCSettings{}) || cfg.MemoryReleaseInterval > 0 {
		log.Info("go runtime memory settings", "gc_percent", gc.GCPercent, "memory_limit_bytes", gc.MemoryLimit,
			"memory_release_interval", cfg.MemoryReleaseInterval.String())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// What a burst of set-ups freed goes back to the OS once it settles
	// (ZTUNNEL_MEMORY_RELEASE_INTERVAL); before Start, for /config_dump.
	app.StartMemoryRelease(ctx, cfg, log)
	d, err := app.Start(ctx, cfg, log, levels)
	if err != nil {
		log.Error("failed to start", "error", err)
		// Also on stderr: whoever reads the exit status reads stderr.
		fmt.Fprintf(stderr, "ztunnel: failed to start: %v\n", err)
		return 1
	}
	select {
	case <-ctx.Done():
		log.Info("received shutdown signal, draining", "deadline", cfg.TerminationDeadline.String())
	case <-d.QuitRequested():
		log.Info("quit requested, draining", "deadline", cfg.TerminationDeadline.String())
	case <-d.Failed():
		log.Error("fatal error, draining and exiting", "error", d.Err())
		d.Drain()
		return 1
	}
	d.Drain()
	return 0
}
