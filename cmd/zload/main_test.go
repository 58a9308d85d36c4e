package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startServer(t *testing.T) string {
	t.Helper()
	return nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		load.NewServer(load.ServerConfig{}).Serve(ctx, ln)
		return nil
	})
}

func zload(t *testing.T, args ...string) (*load.Result, string) {
	t.Helper()
	var out, errb bytes.Buffer
	if err := run(context.Background(), append(args, "--json"), &out, &errb, false); err != nil {
		t.Fatalf("zload %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	var res load.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("zload %s: output %q: %v", strings.Join(args, " "), out.String(), err)
	}
	return &res, errb.String()
}

func TestModesJSON(t *testing.T) {
	addr := startServer(t)
	if r, stderr := zload(t, "rr", "--target", addr, "--count", "20", "--req-size", "3", "--resp-size", "5000"); r.RR == nil || r.RR.Requests != 20 || r.RR.RespSize != 5000 || stderr != "" {
		t.Fatalf("rr: %+v, stderr %q", r.RR, stderr)
	}
	if r, _ := zload(t, "cps", "--target", addr, "--count", "10", "--concurrency", "2"); r.CPS == nil || r.CPS.Requests != 10 {
		t.Fatalf("cps: %+v", r.CPS)
	}
	if r, _ := zload(t, "throughput", "--target", addr, "--duration", "50ms", "--concurrency", "2"); r.Throughput == nil || r.Throughput.Streams != 2 || r.Throughput.Bytes == 0 {
		t.Fatalf("throughput: %+v", r.Throughput)
	}
	r, stderr := zload(t, "idle", "--target", addr, "--count", "10", "--steps", "2", "--pid", fmt.Sprint(os.Getpid()), "--settle", "1ms", "--final-settle", "20ms", "--hold", "1ms")
	if r.Idle == nil || r.Idle.Connections != 10 || len(r.Idle.Samples) != 3 || len(r.Idle.PerConn) != 1 {
		t.Fatalf("idle: %+v", r.Idle)
	}
	if s := r.Idle.Samples; s[1].Settle != time.Millisecond || s[2].Settle != 20*time.Millisecond {
		t.Fatalf("idle: --final-settle not applied to the last sample only: %+v", s)
	}
	if !strings.Contains(stderr, "zload: holding 10 connections\n") {
		t.Fatalf("idle did not announce the hold: %q", stderr)
	}
}

// The fixed-rate mode of issue 23's CPU measurement, through the flags.
func TestOpenRate(t *testing.T) {
	addr := startServer(t)
	r, _ := zload(t, "rr", "--target", addr, "--count", "100", "--concurrency", "10", "--req-size", "1024", "--resp-size", "1024", "--open-rate", "1000")
	if r.RR == nil || r.RR.Requests != 100 || r.RR.Sent != 100 || r.RR.OpenRate != 1000 || r.RR.Concurrency != 10 || r.RR.SendLag == nil {
		t.Fatalf("rr --open-rate: %+v", r.RR)
	}
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"rr", "--target", addr, "--count", "5", "--open-rate", "500"}, &out, &errb, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "open loop at 500/s: 5 sent, 0 missed, 0 unanswered") || !strings.Contains(out.String(), "send lag µs: p50") {
		t.Fatalf("text output: %q", out.String())
	}
	for _, args := range [][]string{
		{"rr", "--target", addr, "--count", "1", "--open-rate", "10", "--rate", "10"},
		{"cps", "--target", addr, "--count", "1", "--open-rate", "10"},
	} {
		if err := run(context.Background(), args, &out, &errb, false); err == nil {
			t.Errorf("zload %q succeeded", args)
		}
	}
}

func TestTextOutput(t *testing.T) {
	addr := startServer(t)
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"rr", "--target", addr, "--count", "5"}, &out, &errb, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "5 transactions") || !strings.Contains(out.String(), "latency µs: p50") {
		t.Fatalf("text output: %q", out.String())
	}
}

func TestHBONEFlagsIssueACertificate(t *testing.T) {
	ca, err := caclient.NewBuiltinCA("")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	os.WriteFile(certPath, ca.RootPEM(), 0o600)
	os.WriteFile(keyPath, ca.KeyPEM(), 0o600)
	f := flags{hbone: true, target: "127.0.0.1:1", authority: "127.0.0.1:2", sans: load.StringList{"spiffe://cluster.local/ns/a/sa/b"},
		cert: load.CertConfig{CACert: certPath, CAKey: keyPath, Identity: "spiffe://cluster.local/ns/bench/sa/zload"}}
	d, err := newDialer(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Transport() != load.HBONE {
		t.Fatalf("transport %s", d.Transport())
	}
	f.cert.Identity = ""
	if _, err := newDialer(context.Background(), f); err == nil {
		t.Fatal("a certificate was issued without an identity")
	}
}

func TestRejects(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"rr", "--target", "127.0.0.1:1"}, // unbounded
		{"throughput", "--target", "127.0.0.1:1", "--duration", "2h"},           // above the maximum
		{"idle", "--target", "127.0.0.1:1"},                                     // no count
		{"rr", "--target", "127.0.0.1:1", "--count", "1", "--hbone", "--tls"},   // both
		{"rr", "--target", "127.0.0.1:1", "--count", "1", "--ca-cert", "x.pem"}, // certificate without tls
		{"rr", "--target", "127.0.0.1:1", "--count", "1", "--hbone"},            // no certificate
		{"server", "--listen", "127.0.0.1:0"},                                   // unbounded server
		{"rr", "--count", "1"},                                                  // no target
		{"rr", "--target", "127.0.0.1:1", "--count", "1", "extra"},
	} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), args, &out, &errb, false); err == nil {
			t.Errorf("zload %q succeeded", args)
		}
	}
}

func TestServerIsBounded(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"server", "--listen", "127.0.0.1:0", "--duration", "50ms"}, &out, &errb, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errb.String(), "serving on 127.0.0.1:") {
		t.Fatalf("stderr %q", errb.String())
	}
}
