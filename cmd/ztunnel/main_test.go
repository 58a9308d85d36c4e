package main

import (
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// runWith runs the daemon's main with env and returns its exit code and
// what it wrote to stderr. Only configurations that fail before any
// listener opens are run here; the lab tests run the real daemon.
func runWith(t *testing.T, args []string, env map[string]string) (int, string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	code := run(args, f)
	f.Seek(0, io.SeekStart)
	out, _ := io.ReadAll(f)
	return code, string(out)
}

func TestBadConfigurationExitsNonZero(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("workloads:\n- uid: a\n  name: a\n  namespace: ns\n  workloadIps: [\"10.0.0.1\"]\n  services: {}\n  colour: blue\n"), 0o600)
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"unknown command", []string{"ztunnel", "frobnicate"}, nil, `unknown command "frobnicate"`},
		{"bad mode", []string{"ztunnel", "proxy", "ztunnel"}, map[string]string{"PROXY_MODE": "sidecar"}, "PROXY_MODE"},
		{"bad window", []string{"ztunnel", "proxy"}, map[string]string{"HTTP2_STREAM_WINDOW_SIZE": "big"}, "HTTP2_STREAM_WINDOW_SIZE"},
		{"missing config file", []string{"ztunnel", "proxy"}, map[string]string{
			"PROXY_MODE": "dedicated", "PROXY_WORKLOAD_INFO": "ns/a/sa", "LOCAL_XDS_PATH": "/nonexistent/config.yaml",
			"ZTUNNEL_READINESS_ADDR": "127.0.0.1:0", "ZTUNNEL_ADMIN_ADDR": "127.0.0.1:0",
		}, "LOCAL_XDS_PATH"},
		{"unknown field in config", []string{"ztunnel", "proxy"}, map[string]string{
			"PROXY_MODE": "dedicated", "PROXY_WORKLOAD_INFO": "ns/a/sa", "LOCAL_XDS_PATH": bad,
		}, "line 7"},
		{"stats address that cannot be bound", []string{"ztunnel", "proxy"}, map[string]string{
			"PROXY_MODE": "dedicated", "PROXY_WORKLOAD_INFO": "ns/a/sa", "LOCAL_XDS": "workloads: []",
			"ZTUNNEL_READINESS_ADDR": "127.0.0.1:0", "ZTUNNEL_ADMIN_ADDR": "127.0.0.1:0", "ZTUNNEL_STATS_ADDR": "192.0.2.1:15020",
		}, "ZTUNNEL_STATS_ADDR=192.0.2.1:15020"},
		{"shared mode without a packet mark", []string{"ztunnel"}, map[string]string{"LOCAL_XDS": "workloads: []", "PACKET_MARK": "0",
			"ZTUNNEL_READINESS_ADDR": "127.0.0.1:0", "ZTUNNEL_ADMIN_ADDR": "127.0.0.1:0", "ZTUNNEL_STATS_ADDR": "127.0.0.1:0"}, "PACKET_MARK=0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runWith(t, tc.args, tc.env)
			if code == 0 {
				t.Fatalf("exit code 0, want non-zero; stderr:\n%s", out)
			}
			if !strings.Contains(out, tc.want) {
				t.Fatalf("stderr does not mention %q:\n%s", tc.want, out)
			}
		})
	}
}

// captureStdout runs f with os.Stdout sent to a file and returns what f
// wrote there (the daemon logs to stdout, as ztunnel does).
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	saved := os.Stdout
	os.Stdout = out
	defer func() { os.Stdout = saved }()
	f()
	b, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version", "-V"} {
		t.Run(arg, func(t *testing.T) {
			var code int
			out := captureStdout(t, func() { code, _ = runWith(t, []string{"ztunnel", arg}, nil) })
			if code != 0 || !strings.HasPrefix(out, "ztunnel-go ") && !strings.Contains(out, "version") {
				t.Fatalf("exit code %d, stdout %q", code, out)
			}
		})
	}
}

// TestWorkerThreadsLogged: the daemon sizes GOMAXPROCS as ztunnel sizes its
// worker threads and says so at start (here from the chart's CPU limit,
// before a start that then fails on a missing config file).
func TestWorkerThreadsLogged(t *testing.T) {
	t.Cleanup(func() { runtime.GOMAXPROCS(runtime.NumCPU()) })
	out := captureStdout(t, func() {
		runWith(t, []string{"ztunnel", "proxy"}, map[string]string{
			"ZTUNNEL_RESOURCE_CPU_LIMIT": "1", "PROXY_MODE": "dedicated", "PROXY_WORKLOAD_INFO": "ns/a/sa",
			"LOCAL_XDS_PATH": "/nonexistent/config.yaml", "ZTUNNEL_READINESS_ADDR": "127.0.0.1:0",
			"ZTUNNEL_ADMIN_ADDR": "127.0.0.1:0", "ZTUNNEL_STATS_ADDR": "127.0.0.1:0",
		})
	})
	var line string
	for l := range strings.Lines(out) {
		if strings.Contains(l, "worker threads") {
			line = l
		}
	}
	if !strings.Contains(line, "gomaxprocs=1") || !strings.Contains(line, `from="default"`) {
		t.Fatalf("no worker threads line with gomaxprocs=1 from=default in:\n%s", out)
	}
}
