package harness

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/bench/peers"
	"github.com/ztunnel-go/ztunnel/bench/report"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// TestPythonRRClient runs rrclient.py, as zbench --clients writes it out,
// against the zload server over each transport it speaks (plain TCP, mutual
// TLS through a TLS terminator, HBONE through an x/net/http2 CONNECT
// server), with the certificates the harness issues, and reads its output
// with parsePythonRR. The 100 B/20 KB case moves more than the 64 KiB HTTP/2
// window, so the client's WINDOW_UPDATEs must work.
func TestPythonRRClient(t *testing.T) {
	python := netnslab.RequireTool(t, "python3", "python3")
	dir := t.TempDir()
	ca := tlstest.NewRoot(t, tlstest.CAOptions{TrustDomains: []string{"cluster.local"}})
	b := &bench{dir: dir, caCert: filepath.Join(dir, "ca-cert.pem"), caKey: filepath.Join(dir, "ca-key.pem")}
	for f, data := range map[string][]byte{b.caCert: ca.PEM(), b.caKey: ca.KeyPEM(t)} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	clientPEM, err := b.writeHAProxyCert(ctx, zloadSA)
	if err != nil {
		t.Fatal(err)
	}
	srvCert, err := load.LoadCert(ctx, load.CertConfig{CACert: b.caCert, CAKey: b.caKey, Identity: spiffe(peerServerSA)})
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "rrclient.py")
	if err := os.WriteFile(script, rrClientPy, 0o644); err != nil {
		t.Fatal(err)
	}
	sink := nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return load.NewServer(load.ServerConfig{}).Serve(ctx, ln)
	})
	tlsTerm := nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return peers.TLS(ctx, ln, sink, srvCert, peers.Config{})
	})
	h2 := nettest.ServeFunc(t, func(ctx context.Context, ln net.Listener) error {
		return peers.H2Server(ctx, ln, srvCert, peers.Config{})
	})
	certs := []string{"--cert", clientPEM, "--ca", b.caCert}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"plain", []string{"--target", sink}},
		{"plain 1KB/16KB", []string{"--target", sink, "--req-size", "1024", "--resp-size", "16384"}},
		{"mTLS", append([]string{"--target", tlsTerm, "--tls"}, certs...)},
		{"HBONE", append([]string{"--target", h2, "--hbone", sink}, certs...)},
		{"HBONE 100B/20KB", append([]string{"--target", h2, "--hbone", sink, "--req-size", "100", "--resp-size", "20000"}, certs...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, python, append([]string{script, "--count", "50", "--warmup", "5"}, tc.args...)...).Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				t.Fatalf("rrclient.py: %v: %s", err, stderr)
			}
			r, err := parsePythonRR(out)
			if err != nil {
				t.Fatal(err)
			}
			if r.Count != 50 || r.PerSecond <= 0 || r.P50 <= 0 || r.P99 < r.P50 || r.Max < r.P99 {
				t.Fatalf("rrclient.py: %+v", r)
			}
		})
	}
}

// TestParseIperf3 reads a real iperf3 -J report (one stream over loopback)
// and iperf3's failure reports.
func TestParseIperf3(t *testing.T) {
	iperf3 := netnslab.RequireTool(t, "iperf3", "iperf3")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := exec.CommandContext(ctx, iperf3, "-s", "-1", "-B", "127.0.0.1", "-p", strconv.Itoa(port))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	var real []byte
	for {
		real, err = exec.CommandContext(ctx, iperf3, "-c", "127.0.0.1", "-p", strconv.Itoa(port), "-n", "8M", "-J").Output()
		// iperf3 -J reports a refused connection in its JSON, with or
		// without a failing exit status: retry until the server listens
		// (probing its port would use up its one test, -1).
		if ctx.Err() != nil || !strings.Contains(string(real), "unable to connect") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("iperf3 -c: %v: %s", err, real)
	}
	for _, tc := range []struct {
		name    string
		in      string
		wantErr string
	}{
		{"real", string(real), ""},
		{"refused", `{"start":{},"intervals":[],"end":{},"error":"unable to connect to server: Connection refused"}`, "unable to connect"},
		{"nothing received", `{"start":{},"end":{"sum_received":{"seconds":0,"bits_per_second":0}}}`, "nothing received"},
		{"not JSON", "iperf3: error", "output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseIperf3([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseIperf3 = %+v, %v; want an error with %q", r, err, tc.wantErr)
				}
				return
			}
			if err != nil || r.Gbps <= 0 || r.Seconds <= 0 {
				t.Fatalf("parseIperf3 = %+v, %v", r, err)
			}
		})
	}
}

// TestClientsMarkdown pins the ratios: latency ours ÷ HAProxy's, throughput
// HAProxy's ÷ ours, each against the path's group's HAProxy path, medians of
// the rounds.
func TestClientsMarkdown(t *testing.T) {
	ours2, ha2 := report.ConfigID(report.GroupHBONE2, report.DaemonKey("epoll")), report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPair)
	ours1, ha1 := report.ConfigID(report.GroupHBONE1, report.DaemonKey("epoll")), report.ConfigID(report.GroupHBONE1, report.KeyHAProxyTLS)
	hc2 := report.ConfigID(report.GroupHBONE2, report.KeyHAProxyPairCaptured)
	cr := &Clients{Rounds: 3, Count: 100, Duration: time.Second, Paths: []ClientPath{
		{ID: ours1, Group: report.GroupHBONE1, Daemon: true, Clients: []string{ClientPythonRR}},
		{ID: ha1, Group: report.GroupHBONE1, Clients: []string{ClientPythonRR}},
		{ID: ours2, Group: report.GroupHBONE2, Daemon: true, Clients: []string{ClientPythonRR, ClientIperf3}},
		{ID: ha2, Group: report.GroupHBONE2, Clients: []string{ClientPythonRR, ClientIperf3}},
		{ID: hc2, Group: report.GroupHBONE2, Clients: []string{ClientPythonRR, ClientIperf3}},
	}}
	add := func(path, client string, vals ...float64) {
		for i, v := range vals {
			s := ClientSample{Path: path, Client: client, Round: i + 1}
			if client == ClientIperf3 {
				s.Gbps = v
				// Client side per round: ours 900, 1000, 2000, HAProxy
				// 1000, 500, 1000: paired 2.00× where the medians'
				// ratio is 1.00; the captured pair half of ours each
				// round: 2.00× on both sides.
				cs, ss := []float64{900, 1000, 2000}[i], 600.0
				switch path {
				case ha2:
					cs = []float64{1000, 500, 1000}[i]
				case hc2:
					cs, ss = cs/2, 300
				}
				s.Procs = []ProcCPU{{Role: "client side", Name: "a", CPUus: cs}, {Role: "server side", Name: "b", CPUus: ss}}
			} else {
				s.P50us, s.P99us = v, 2*v
			}
			cr.Samples = append(cr.Samples, s)
		}
	}
	add(ours1, ClientPythonRR, 92, 100, 1000) // median 100
	add(ha1, ClientPythonRR, 80, 110, 60)     // median 80
	add(ours2, ClientPythonRR, 110, 120, 130)
	add(ha2, ClientPythonRR, 100, 100, 100)
	add(ours2, ClientIperf3, 3, 3, 3)
	add(ha2, ClientIperf3, 4.5, 4.5, 1)
	add(hc2, ClientPythonRR, 120, 100, 130)
	add(hc2, ClientIperf3, 6, 6, 1.5)
	md := ClientsMarkdown(cr)
	for _, want := range []string{
		// Per round 92/80, 100/110, 1000/60: paired 1.15, where the
		// medians' ratio is 100/80.
		// No captured terminator in this run.
		"| python-rr | " + ours1 + " | 100 µs | 92–1000 | 200 µs | 0.0 | **1.25×** | 1.15× | — |",
		// Against the captured pair per round 110/120, 120/100,
		// 130/130: paired 1.00.
		"| python-rr | " + ours2 + " | 120 µs | 110–130 | 240 µs | 0.0 | **1.20×** | 1.20× | 1.00× |",
		// Per round 4.5/3, 4.5/3, 1/3: paired 1.50; captured 6/3,
		// 6/3, 1.5/3: 2.00.
		"| iperf3 | " + ours2 + " | 3.00 Gbit/s | 3.00–3.00 | — | 0.0 | **1.50×** | 1.50× | 2.00× |",
		"| iperf3 | " + ha2 + " | 4.50 Gbit/s | 1.00–4.50 | — | 0.0 | — | — | — |",
		// CPU per byte by process: median and range over the rounds.
		"| iperf3 | " + ours2 + " | client side | 1000 | 900–2000 | 2.00× | 2.00× |",
		"| iperf3 | " + ours2 + " | server side | 600 | 600–600 | 1.00× | 2.00× |",
		"| iperf3 | " + ha2 + " | client side | 1000 | 500–1000 | — | — |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("CLIENTS.md lacks %q:\n%s", want, md)
		}
	}
	if err := checkClients(cr); err != nil {
		t.Errorf("checkClients: %v", err)
	}
	cr.Paths[0].Clients = append(cr.Paths[0].Clients, ClientZloadRR)
	if err := checkClients(cr); err == nil || !strings.Contains(err.Error(), ours1+" "+ClientZloadRR) {
		t.Errorf("checkClients with a missing figure: %v", err)
	}
}
