package app

import (
	"strings"
	"testing"
	"time"
)

func lookupFrom(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseEnvDefaults(t *testing.T) {
	c, err := ParseEnv(lookupFrom(map[string]string{
		"PROXY_MODE": "dedicated", "PROXY_WORKLOAD_INFO": "ns1/pod1/sa1", "LOCAL_XDS_PATH": "/x.yaml",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != ModeDedicated || c.Workload.Namespace != "ns1" || c.Workload.Name != "pod1" || c.Workload.ServiceAccount != "sa1" {
		t.Fatalf("mode/workload: %+v", c)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"FakeCA implied by local config", c.FakeCA, true},
		{"no xDS with a local config", c.XDSAddress, ""},
		{"cluster", c.ClusterID, "Kubernetes"},
		{"trust domain", c.TrustDomain, "cluster.local"},
		{"mark unset in dedicated", c.PacketMark, uint32(0)},
		{"stream window", c.StreamWindow, uint32(4 << 20)},
		{"connection window", c.ConnectionWindow, uint32(16 << 20)},
		{"frame size", c.FrameSize, uint32(1 << 20)},
		{"pool streams", c.PoolMaxStreams, 100},
		{"pool idle", c.PoolUnusedRelease, 5 * time.Minute},
		{"inner HBONE not pooled", c.PoolInnerHBONE, false},
		{"termination deadline", c.TerminationDeadline, 5 * time.Second},
		{"admin", c.AdminAddr, "localhost:15000"},
		{"secret ttl", c.SecretTTL, 24 * time.Hour},
		{"socks5 off", c.EnableSOCKS5, false},
		{"app tunnel over loopback", c.LocalhostAppTunnel, true},
		{"memory release interval", c.MemoryReleaseInterval, DefaultMemoryReleaseInterval},
		{"stream loops block", c.EngineStreamWait, "block"},
		{"descriptor budget from the limit", c.FDBudget, "auto"},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s: got %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

func TestParseEnvSharedDefaults(t *testing.T) {
	c, err := ParseEnv(lookupFrom(map[string]string{}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != ModeShared || c.PacketMark != 1337 || c.XDSAddress == "" || c.FakeCA {
		t.Fatalf("shared defaults wrong: %+v", c)
	}
}

func TestParseEnvOverrides(t *testing.T) {
	c, err := ParseEnv(lookupFrom(map[string]string{
		"PROXY_MODE": "dedicated", "PROXY_WORKLOAD_INFO": "a/b/c", "LOCAL_XDS": "workloads: []",
		"CLUSTER_ID": "c1", "ISTIO_META_CLUSTER_ID": "c2", "TRUST_DOMAIN": "example.org",
		"NODE_NAME": "node-a", "NETWORK": "net1", "PACKET_MARK": "99", "PREFERED_SERVICE_NAMESPACE": "istio-system",
		"HTTP2_STREAM_WINDOW_SIZE": "65535", "HTTP2_CONNECTION_WINDOW_SIZE": "1048576", "HTTP2_FRAME_SIZE": "16384",
		"CONNECTION_TERMINATION_DEADLINE": "30s", "ENABLE_ORIG_SRC": "false", "ZTUNNEL_POOL_INNER_HBONE": "true",
		"ZTUNNEL_ENGINE_STREAM_WAIT": "park", "ZTUNNEL_FD_BUDGET": "5000",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.ClusterID != "c2" || c.TrustDomain != "example.org" || c.NodeName != "node-a" || c.Network != "net1" ||
		c.PacketMark != 99 || c.StreamWindow != 65535 || c.ConnectionWindow != 1<<20 || c.FrameSize != 16384 ||
		c.TerminationDeadline != 30*time.Second || c.OrigSrc == nil || *c.OrigSrc || c.PreferredServiceNamespace != "istio-system" ||
		!c.PoolInnerHBONE || c.EngineStreamWait != "park" || c.FDBudget != "5000" {
		t.Fatalf("overrides not applied: %+v", c)
	}
}

func TestParseEnvSOCKS5AndAppTunnel(t *testing.T) {
	tests := []struct {
		name             string
		env              map[string]string
		socks, localhost bool
		wantErr          bool
	}{
		{"defaults", map[string]string{}, false, true, false},
		{"socks5 on", map[string]string{"UNSTABLE_ENABLE_SOCKS5": "true"}, true, true, false},
		{"app tunnel direct", map[string]string{"LOCALHOST_APP_TUNNEL": "false"}, false, false, false},
		{"bad socks5 value", map[string]string{"UNSTABLE_ENABLE_SOCKS5": "maybe"}, false, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"PROXY_MODE": "dedicated", "PROXY_WORKLOAD_INFO": "a/b/c", "LOCAL_XDS": "workloads: []"}
			for k, v := range tc.env {
				env[k] = v
			}
			c, err := ParseEnv(lookupFrom(env))
			if tc.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.EnableSOCKS5 != tc.socks || c.LocalhostAppTunnel != tc.localhost {
				t.Fatalf("socks5 %v, localhost app tunnel %v; want %v, %v", c.EnableSOCKS5, c.LocalhostAppTunnel, tc.socks, tc.localhost)
			}
		})
	}
}

func TestTerminationGracePeriodRule(t *testing.T) {
	tests := []struct {
		grace string
		want  time.Duration
	}{
		{"30", 25 * time.Second}, {"10", 9 * time.Second}, {"1", time.Second}, {"0", time.Second},
	}
	for _, tc := range tests {
		c, err := ParseEnv(lookupFrom(map[string]string{"TERMINATION_GRACE_PERIOD_SECONDS": tc.grace}))
		if err != nil {
			t.Fatal(err)
		}
		if c.TerminationDeadline != tc.want {
			t.Errorf("grace %s: deadline %v, want %v", tc.grace, c.TerminationDeadline, tc.want)
		}
	}
}

func TestParseEnvErrorsNameTheVariable(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"bad mode", map[string]string{"PROXY_MODE": "sidecar"}, "PROXY_MODE"},
		{"dedicated without workload", map[string]string{"PROXY_MODE": "dedicated"}, "PROXY_WORKLOAD_INFO"},
		{"bad workload info", map[string]string{"PROXY_WORKLOAD_INFO": "a/b"}, "PROXY_WORKLOAD_INFO"},
		{"both local configs", map[string]string{"LOCAL_XDS_PATH": "a", "LOCAL_XDS": "b"}, "LOCAL_XDS"},
		{"bad bool", map[string]string{"FAKE_CA": "yes please"}, "FAKE_CA"},
		{"bad inner pooling bool", map[string]string{"ZTUNNEL_POOL_INNER_HBONE": "sometimes"}, "ZTUNNEL_POOL_INNER_HBONE"},
		{"bad mark", map[string]string{"PACKET_MARK": "-1"}, "PACKET_MARK"},
		{"window zero", map[string]string{"HTTP2_STREAM_WINDOW_SIZE": "0"}, "HTTP2_STREAM_WINDOW_SIZE"},
		{"window too big", map[string]string{"HTTP2_CONNECTION_WINDOW_SIZE": "4294967295"}, "HTTP2_CONNECTION_WINDOW_SIZE"},
		{"frame too small", map[string]string{"HTTP2_FRAME_SIZE": "100"}, "HTTP2_FRAME_SIZE"},
		{"bad duration", map[string]string{"CONNECTION_TERMINATION_DEADLINE": "soon"}, "CONNECTION_TERMINATION_DEADLINE"},
		{"certificates valid for no time", map[string]string{"SECRET_TTL": "0"}, "SECRET_TTL"},
		{"keepalive after no idle time", map[string]string{"KEEPALIVE_TIME": "0s"}, "KEEPALIVE_TIME"},
		{"keepalive probes without interval", map[string]string{"KEEPALIVE_INTERVAL": "0"}, "KEEPALIVE_INTERVAL"},
		{"pool release after no time", map[string]string{"POOL_UNUSED_RELEASE_TIMEOUT": "0ms"}, "POOL_UNUSED_RELEASE_TIMEOUT"},
		{"bad release interval", map[string]string{"ZTUNNEL_MEMORY_RELEASE_INTERVAL": "often"}, "ZTUNNEL_MEMORY_RELEASE_INTERVAL"},
		{"bad stream wait", map[string]string{"ZTUNNEL_ENGINE_STREAM_WAIT": "spin"}, "ZTUNNEL_ENGINE_STREAM_WAIT"},
		{"bad descriptor budget", map[string]string{"ZTUNNEL_FD_BUDGET": "lots"}, "ZTUNNEL_FD_BUDGET"},
		{"zero descriptor budget", map[string]string{"ZTUNNEL_FD_BUDGET": "0"}, "ZTUNNEL_FD_BUDGET"},
		{"bad log format", map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT"},
		{"bad log level", map[string]string{"RUST_LOG": "access=loud"}, "RUST_LOG"},
		{"admin off host", map[string]string{"ZTUNNEL_ADMIN_ADDR": "0.0.0.0:15000"}, "ZTUNNEL_ADMIN_ADDR"},
		{"CA key without cert", map[string]string{"BUILTIN_CA_KEY": "k.pem"}, "BUILTIN_CA_KEY"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseEnv(lookupFrom(tc.env))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v does not name %s", err, tc.want)
			}
		})
	}
}

func TestParseLogLevel(t *testing.T) {
	for _, ok := range []string{"info", "debug", "warn,access=debug", "hbone=trace,error", "off"} {
		if _, err := ParseEnv(lookupFrom(map[string]string{"RUST_LOG": ok})); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if _, err := ParseEnv(lookupFrom(map[string]string{"RUST_LOG": "access=shout"})); err == nil {
		t.Error("bad scoped level accepted")
	}
}

func TestChartVariables(t *testing.T) {
	c, err := ParseEnv(lookupFrom(map[string]string{
		"POD_NAME": "ztunnel-abc", "POD_NAMESPACE": "istio-system", "SERVICE_ACCOUNT": "ztunnel",
		"INSTANCE_IP": "10.0.0.9", "ZTUNNEL_CPU_LIMIT": "500m", "ZTUNNEL_RESOURCE_CPU_REQUEST": "2",
		"INPOD_ENABLED": "true", "ISTIO_META_ISTIO_VERSION": "1.27.0",
		"CRL_PATH": "/var/run/secrets/istio/crl/ca-crl.pem",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.PodName != "ztunnel-abc" || c.PodNamespace != "istio-system" || c.ServiceAccount != "ztunnel" ||
		c.InstanceIP != "10.0.0.9" || c.CPULimit != 0.5 || c.CPURequest != 2 || c.IstioVersion != "1.27.0" ||
		c.CRLPath != "/var/run/secrets/istio/crl/ca-crl.pem" {
		t.Fatalf("chart variables: %+v", c)
	}
	for _, kv := range [][2]string{{"INSTANCE_IP", "node-a"}, {"ZTUNNEL_CPU_LIMIT", "lots"},
		{"ZTUNNEL_RESOURCE_CPU_REQUEST", "NaN"}, {"ZTUNNEL_CPU_LIMIT", "inf"}} {
		name, v := kv[0], kv[1]
		if _, err := ParseEnv(lookupFrom(map[string]string{name: v})); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: error %v does not name it", name, v, err)
		}
	}
}

func TestDNSEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		capture bool
		addrs   []string
		domain  string
		resolv  string
	}{
		{"defaults: on, both loopbacks", map[string]string{}, true, []string{"127.0.0.1:15053", "[::1]:15053"}, "cluster.local", "/etc/resolv.conf"},
		{"explicitly on", map[string]string{"ISTIO_META_DNS_CAPTURE": "TRUE"}, true, []string{"127.0.0.1:15053", "[::1]:15053"}, "cluster.local", "/etc/resolv.conf"},
		{"anything but true is off", map[string]string{"ISTIO_META_DNS_CAPTURE": "yes"}, false, []string{"127.0.0.1:15053", "[::1]:15053"}, "cluster.local", "/etc/resolv.conf"},
		{"off allows on-demand xDS", map[string]string{"ISTIO_META_DNS_CAPTURE": "false", "XDS_ON_DEMAND": "true"}, false, []string{"127.0.0.1:15053", "[::1]:15053"}, "cluster.local", "/etc/resolv.conf"},
		{"localhost with another port", map[string]string{"ISTIO_META_DNS_PROXY_ADDR": "localhost:5353"}, true, []string{"127.0.0.1:5353", "[::1]:5353"}, "cluster.local", "/etc/resolv.conf"},
		{"one address", map[string]string{"ISTIO_META_DNS_PROXY_ADDR": "[::1]:15053"}, true, []string{"[::1]:15053"}, "cluster.local", "/etc/resolv.conf"},
		{"cluster domain and resolv.conf", map[string]string{"CLUSTER_DOMAIN": "corp.example", "ZTUNNEL_RESOLV_CONF": "/tmp/r"}, true, []string{"127.0.0.1:15053", "[::1]:15053"}, "corp.example", "/tmp/r"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseEnv(lookupFrom(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if c.DNSCapture != tc.capture || strings.Join(c.DNSProxyAddrs, ",") != strings.Join(tc.addrs, ",") ||
				c.ClusterDomain != tc.domain || c.ResolvConf != tc.resolv {
				t.Fatalf("capture %v addrs %v domain %q resolv %q", c.DNSCapture, c.DNSProxyAddrs, c.ClusterDomain, c.ResolvConf)
			}
		})
	}
	for name, env := range map[string]map[string]string{
		"ISTIO_META_DNS_PROXY_ADDR": {"ISTIO_META_DNS_PROXY_ADDR": "dns.local:53"},
		"CLUSTER_DOMAIN":            {"CLUSTER_DOMAIN": "a b"},
		"XDS_ON_DEMAND":             {"XDS_ON_DEMAND": "true"},
	} {
		t.Run("bad "+name, func(t *testing.T) {
			if _, err := ParseEnv(lookupFrom(env)); err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("error %v does not name %s", err, name)
			}
		})
	}
	for _, bad := range []string{"localhost:http", "localhost:70000", "10.0.0.1", "[fe80::1%eth0]:53"} {
		t.Run("bad address "+bad, func(t *testing.T) {
			if _, err := ParseEnv(lookupFrom(map[string]string{"ISTIO_META_DNS_PROXY_ADDR": bad})); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// TestDefaultControlPlane: without a local config the control plane is
// istiod's service inside Kubernetes (KUBERNETES_SERVICE_HOST set) and
// localhost:15012 elsewhere, as in ztunnel; XDS_ADDRESS and CA_ADDRESS
// choose for themselves, and a local config needs no control plane.
func TestDefaultControlPlane(t *testing.T) {
	cases := []struct {
		name       string
		env        map[string]string
		wantXDS    string
		wantCA     string
		wantFakeCA bool
	}{
		{"outside Kubernetes", map[string]string{}, "https://localhost:15012", "https://localhost:15012", false},
		{"in a pod", map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
			"https://istiod.istio-system.svc:15012", "https://istiod.istio-system.svc:15012", false},
		{"addresses set", map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "XDS_ADDRESS": "istiod-1:15012", "CA_ADDRESS": "https://ca:15012"},
			"https://istiod-1:15012", "https://ca:15012", false},
		{"local config", map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "LOCAL_XDS_PATH": "/x.yaml"}, "", "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseEnv(lookupFrom(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if c.XDSAddress != tc.wantXDS || c.CAAddress != tc.wantCA || c.FakeCA != tc.wantFakeCA {
				t.Fatalf("XDS %q CA %q FakeCA %v; want %q %q %v", c.XDSAddress, c.CAAddress, c.FakeCA, tc.wantXDS, tc.wantCA, tc.wantFakeCA)
			}
		})
	}
}
