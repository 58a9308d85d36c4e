// Command zpeer runs one of the benchmark's baseline proxies (package
// bench/peers) as its own process, so that the harness measures its CPU,
// memory and goroutines exactly as it measures the daemon's.
//
//	zpeer copy       --listen 127.0.0.1:9001 --to 10.244.1.3:8080 --duration 20m
//	zpeer tls        --listen :9444 --to 127.0.0.1:8080 --ca-cert ca.pem --ca-key ca-key.pem --identity spiffe://…
//	zpeer h2-server  --listen :9443 --ca-cert … --ca-key … --identity spiffe://…
//	zpeer h2-client  --listen 127.0.0.1:9004 --to 10.244.1.3:9443 --authority 10.244.1.3:8080 \
//	                 --ca-cert … --ca-key … --identity spiffe://… --san spiffe://…
//
// --pprof host:port serves /debug/pprof/ (loopback only is advisable). Every
// peer exits after --duration, which is required.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/bench/peers"
)

func main() { load.Main("zpeer", run) }

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: zpeer copy|tls|h2-server|h2-client [flags]")
		return flag.ErrHelp
	}
	mode := args[0]
	fs := flag.NewFlagSet("zpeer "+mode, flag.ContinueOnError)
	var (
		listen, to, authority, pprofAddr string
		duration                         time.Duration
		origDst                          bool
		mark                             int
		cert                             load.CertConfig
		sans                             load.StringList
	)
	fs.StringVar(&listen, "listen", "", "address to listen on (required)")
	fs.StringVar(&to, "to", "", "upstream address (copy, tls: the backend; h2-client: the h2-server)")
	fs.BoolVar(&origDst, "original-dst", false, "copy: forward to each connection's SO_ORIGINAL_DST (behind capture rules) instead of --to")
	fs.IntVar(&mark, "mark", 0, "SO_MARK on upstream sockets (1337 bypasses the pod's capture rules)")
	fs.StringVar(&authority, "authority", "", "h2-client: the CONNECT authority")
	fs.StringVar(&pprofAddr, "pprof", "", "serve /debug/pprof/ on this address")
	fs.DurationVar(&duration, "duration", 0, "exit after this long (required)")
	fs.StringVar(&cert.CACert, "ca-cert", "", "PEM root of the mesh CA")
	fs.StringVar(&cert.CAKey, "ca-key", "", "PEM key of the mesh CA (issue our certificate)")
	fs.StringVar(&cert.CertFile, "cert", "", "PEM certificate chain (instead of --ca-key)")
	fs.StringVar(&cert.KeyFile, "key", "", "PEM key for --cert")
	fs.StringVar(&cert.Identity, "identity", "", "our SPIFFE identity")
	fs.Var(&sans, "san", "h2-client: expected server identity (repeatable)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if listen == "" {
		return errors.New("--listen is required")
	}
	if err := (load.Bounds{Duration: duration}).Validate(); err != nil {
		return fmt.Errorf("%w (--duration)", err)
	}
	ctx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	if pprofAddr != "" {
		stopPprof, err := servePprof(ctx, pprofAddr)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	cfg := peers.Config{Mark: mark, Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }}
	switch mode {
	case "copy":
		if (to == "") == !origDst {
			return errors.New("give exactly one of --to and --original-dst")
		}
		return peers.Copy(ctx, ln, to, cfg)
	case "tls", "h2-server", "h2-client":
		c, err := load.LoadCert(ctx, cert)
		if err != nil {
			return err
		}
		switch mode {
		case "tls":
			if to == "" {
				return errors.New("--to is required")
			}
			return peers.TLS(ctx, ln, to, c, cfg)
		case "h2-server":
			return peers.H2Server(ctx, ln, c, cfg)
		default:
			if to == "" || authority == "" {
				return errors.New("--to and --authority are required")
			}
			return peers.H2Client(ctx, ln, to, authority, c, sans, cfg)
		}
	default:
		ln.Close()
		return fmt.Errorf("unknown mode %q", mode)
	}
}

// servePprof serves the pprof handlers on their own mux (never the default
// one) until stop is called.
func servePprof(ctx context.Context, addr string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, nil
}
