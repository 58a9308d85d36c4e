package app

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCompatHonoured: the ztunnel variables that map onto this build are
// read into the settings the daemon applies.
func TestCompatHonoured(t *testing.T) {
	cpus := runtime.NumCPU()
	for _, tc := range []struct {
		name  string
		env   map[string]string
		check func(*Config) bool
	}{
		{"defaults", nil, func(c *Config) bool {
			return c.IPv6Enabled && !c.UserTimeoutEnabled && !c.PolicyInfoLogging && !c.PQC && c.WorkerThreads == max(2, (cpus+3)/4) && c.WorkerThreadsFrom == "default" &&
				bindHost(c) == "::" && userTimeout(c) == 0 && slices.Equal(c.DNSProxyAddrs, []string{"127.0.0.1:15053", "[::1]:15053"})
		}},
		{"IPV6_ENABLED=false", map[string]string{"IPV6_ENABLED": "false"}, func(c *Config) bool {
			return bindHost(c) == "0.0.0.0" && slices.Equal(c.DNSProxyAddrs, []string{"127.0.0.1:15053"}) &&
				c.StatsAddr == "0.0.0.0:15020" && c.ReadinessAddr == "0.0.0.0:15021"
		}},
		{"USER_TIMEOUT_ENABLED", map[string]string{"USER_TIMEOUT_ENABLED": "true", "KEEPALIVE_TIME": "10s", "KEEPALIVE_INTERVAL": "5s", "KEEPALIVE_RETRIES": "3"},
			func(c *Config) bool { return userTimeout(c) == 25*time.Second }},
		{"AUTHZ_POLICY_INFO_LOGGING", map[string]string{"AUTHZ_POLICY_INFO_LOGGING": "true"}, func(c *Config) bool { return c.PolicyInfoLogging }},
		{"AUTHZ_POLICY_INFO_LOGGING is exact", map[string]string{"AUTHZ_POLICY_INFO_LOGGING": "True"}, func(c *Config) bool { return !c.PolicyInfoLogging }},
		{"COMPLIANCE_POLICY=pqc", map[string]string{"COMPLIANCE_POLICY": "pqc"}, func(c *Config) bool { return c.PQC }},
		{"TLS12_ENABLED=false", map[string]string{"TLS12_ENABLED": "false"}, func(c *Config) bool { return true }},
		{"ENABLE_PROXY=true", map[string]string{"ENABLE_PROXY": "true", "ENABLE_RESPONSE_BAGGAGE": "true"}, func(c *Config) bool { return true }},
		{"worker threads fixed", map[string]string{"ZTUNNEL_WORKER_THREADS": "3"}, func(c *Config) bool { return c.WorkerThreads == 3 }},
		{"worker threads of the resource limit", map[string]string{"ZTUNNEL_WORKER_THREADS": "50%", "ZTUNNEL_RESOURCE_CPU_LIMIT": "3500m"},
			func(c *Config) bool { return c.WorkerThreads == 2 && c.CPUResourceLimit == 3.5 }},
		{"worker threads of ZTUNNEL_CPU_LIMIT", map[string]string{"ZTUNNEL_WORKER_THREADS": "100%", "ZTUNNEL_CPU_LIMIT": "5"},
			func(c *Config) bool { return c.WorkerThreads == 5 }},
		{"worker threads 0 means all", map[string]string{"ZTUNNEL_WORKER_THREADS": "0"}, func(c *Config) bool { return c.WorkerThreads == cpus }},
		{"default worker threads of the resource limit", map[string]string{"ZTUNNEL_RESOURCE_CPU_LIMIT": "1", "ZTUNNEL_RESOURCE_CPU_REQUEST": "500m"},
			func(c *Config) bool { return c.WorkerThreads == 1 && c.WorkerThreadsFrom == "default" }},
		{"default worker threads raised to the request", map[string]string{"ZTUNNEL_RESOURCE_CPU_REQUEST": "3"},
			func(c *Config) bool { return c.WorkerThreads == max(3, (cpus+3)/4) }},
		{"SO_REUSEPORT in shared mode", nil, func(c *Config) bool { return reusePort(c) }},
		{"INPOD_PORT_REUSE=false", map[string]string{"INPOD_PORT_REUSE": "false"}, func(c *Config) bool { return !reusePort(c) }},
		{"no SO_REUSEPORT in dedicated mode", map[string]string{"PROXY_MODE": "dedicated", "PROXY_WORKLOAD_INFO": "ns/a/sa", "INPOD_PORT_REUSE": "true"},
			func(c *Config) bool { return c.PortReuse && !reusePort(c) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseEnv(lookupFrom(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Errorf("%+v", c.Compat)
			}
		})
	}
}

// TestCompatRefused: what this build cannot honour fails at start with a
// message naming the variable.
func TestCompatRefused(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"TLS12_ENABLED":           {"TLS12_ENABLED": "true"},
		"ENABLE_PROXY":            {"ENABLE_PROXY": "false"},
		"ENABLE_RESPONSE_BAGGAGE": {"ENABLE_RESPONSE_BAGGAGE": "false"},
		"PROXY_CONFIG":            {"PROXY_CONFIG": "concurrency: 2"},
		"COMPLIANCE_POLICY":       {"COMPLIANCE_POLICY": "fips"},
		"ZTUNNEL_WORKER_THREADS":  {"ZTUNNEL_WORKER_THREADS": "150%"},
		"IPV6_ENABLED":            {"IPV6_ENABLED": "maybe"},
		"USER_TIMEOUT_ENABLED":    {"USER_TIMEOUT_ENABLED": "yes please"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseEnv(lookupFrom(env)); err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("error %v does not name %s", err, name)
			}
		})
	}
}

func TestWorkerThreads(t *testing.T) {
	for _, tc := range []struct {
		v    string
		cpus int
		want int
		bad  bool
	}{
		{"4", 8, 4, false}, {"0", 8, 8, false}, {"25%", 8, 2, false}, {"10%", 4, 1, false}, {"33.3%", 3, 1, false},
		{"0%", 8, 0, true}, {"101%", 8, 0, true}, {"x%", 8, 0, true}, {"-1", 8, 0, true}, {"two", 8, 0, true},
	} {
		got, err := workerThreads(tc.v, tc.cpus)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("workerThreads(%q, %d) = %d, %v", tc.v, tc.cpus, got, err)
		}
	}
}

// TestDefaultWorkerThreads: without ZTUNNEL_WORKER_THREADS the count is
// ztunnel's default_worker_threads (src/config.rs).
func TestDefaultWorkerThreads(t *testing.T) {
	for _, tc := range []struct {
		limit, request float64
		cpus, want     int
	}{
		{0, 0, 2, 2}, {0, 0, 8, 2}, {0, 0, 16, 4}, {0, 0, 64, 16}, {0, 0, 13, 4},
		{0, 3, 8, 3}, {0, 0.5, 2, 2},
		{1, 0, 64, 1}, {2.5, 0, 64, 3}, {1, 4, 64, 4},
	} {
		if got := defaultWorkerThreads(tc.limit, tc.request, tc.cpus); got != tc.want {
			t.Errorf("defaultWorkerThreads(limit %v, request %v, %d cpus) = %d, want %d", tc.limit, tc.request, tc.cpus, got, tc.want)
		}
	}
}

// TestMeshConfigFileRefused: ztunnel reads ./etc/istio/config/mesh; a mesh
// config there is refused rather than ignored.
func TestMeshConfigFileRefused(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if _, err := ParseEnv(lookupFrom(nil)); err != nil {
		t.Fatalf("without the file: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "etc/istio/config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/istio/config/mesh"), []byte("defaultConfig:\n  concurrency: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseEnv(lookupFrom(nil)); err == nil || !strings.Contains(err.Error(), "etc/istio/config/mesh") {
		t.Fatalf("with a mesh config: %v", err)
	}
}
