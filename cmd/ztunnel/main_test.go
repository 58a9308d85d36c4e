package main

import (
	"io"
	"os"
	"path/filepath"
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

func TestVersion(t *testing.T) {
	code, _ := runWith(t, []string{"ztunnel", "version"}, nil)
	if code != 0 {
		t.Fatalf("version exit code %d", code)
	}
}
