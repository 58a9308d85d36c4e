package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/labrun"
)

// demo runs the end-to-end demo of `make demo`.
func demo(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlags("demo", stderr, &c)
	bin := fs.String("ztunnel", "bin/ztunnel", "the ztunnel binary to run in each meshed pod")
	config := fs.String("config", "examples/demo.yaml", "the mesh config (ztunnel LocalConfig YAML)")
	size := fs.Int("transfer-mib", 256, "size of the bulk transfer, MiB")
	keep := fs.Bool("keep", false, "leave the lab up afterwards (remove it with zlab down)")
	fs.Lookup("prefix").DefValue = "zl-meshdemo"
	_ = fs.Set("prefix", "zl-meshdemo")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageError{fmt.Sprintf("demo: unexpected argument %q", fs.Arg(0))}
	}
	if *size < 1 || *size > 4096 {
		return usageError{"demo: --transfer-mib must be 1..4096"}
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("demo: the daemon binary: %w (run make build)", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	start := time.Now()
	if err := labrun.Demo(ctx, labrun.DemoOptions{
		Binary: abs, ConfigPath: *config, Prefix: c.prefix, TransferBytes: *size << 20, Keep: *keep,
	}, stdout); err != nil {
		return fmt.Errorf("demo failed: %w", err)
	}
	fmt.Fprintf(stdout, "==> demo passed in %v; lab torn down\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}
