package app

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// meshConfigPath is where ztunnel reads Istio's mesh config (its
// defaultConfig is a ProxyConfig), relative to the working directory.
const meshConfigPath = "./etc/istio/config/mesh"

// Compat holds the settings of ztunnel's variables that the rest of the
// daemon reads less directly than the fields of Config: each is honoured as
// documented, and the variables this build cannot honour are refused by
// ParseEnv with a message naming them (none is silently ignored).
type Compat struct {
	// IPv6Enabled is IPV6_ENABLED (default true): false binds the proxies'
	// listeners on 0.0.0.0 instead of [::] and the DNS proxy on 127.0.0.1
	// only, as ztunnel does.
	IPv6Enabled bool
	// UserTimeoutEnabled is USER_TIMEOUT_ENABLED (default false): proxied
	// sockets get TCP_USER_TIMEOUT = KEEPALIVE_TIME + KEEPALIVE_RETRIES x
	// KEEPALIVE_INTERVAL, ztunnel's formula.
	UserTimeoutEnabled bool
	// PolicyInfoLogging is AUTHZ_POLICY_INFO_LOGGING=true: policy decision
	// details (the dry-run outcomes) are logged at info instead of debug.
	PolicyInfoLogging bool
	// PQC is COMPLIANCE_POLICY=pqc: TLS key exchange uses X25519MLKEM768
	// only, for HBONE and the control plane.
	PQC bool
	// WorkerThreads is what ZTUNNEL_WORKER_THREADS asks for (N, N% of the
	// CPUs, or 0 for all of them), resolved to a count; unset, ztunnel's
	// default (defaultWorkerThreads). ApplyWorkerThreads sets GOMAXPROCS to
	// it.
	WorkerThreads int
	// WorkerThreadsFrom names what WorkerThreads came from, for the log:
	// the variable, or "default" for ztunnel's sizing.
	WorkerThreadsFrom string
	// CPUResourceLimit is ZTUNNEL_RESOURCE_CPU_LIMIT in cores (0 = unset):
	// the CPU count a WorkerThreads percentage is taken of, before
	// ZTUNNEL_CPU_LIMIT and the machine's count.
	CPUResourceLimit float64
}

// parseCompat reads the variables of Compat and refuses those that would
// change behaviour this build does not have. Called by ParseEnv.
func (e *env) parseCompat(c *Config) {
	cc := &c.Compat
	cc.IPv6Enabled = e.boolean("IPV6_ENABLED", true)
	if !cc.IPv6Enabled {
		// ztunnel then binds its wildcard listeners on 0.0.0.0 and the DNS
		// proxy's "localhost" on 127.0.0.1 only.
		c.DNSProxyAddrs = slices.DeleteFunc(c.DNSProxyAddrs, func(a string) bool { return strings.HasPrefix(a, "[") })
		for _, a := range []*string{&c.StatsAddr, &c.ReadinessAddr} {
			if rest, ok := strings.CutPrefix(*a, "[::]:"); ok {
				*a = "0.0.0.0:" + rest
			}
		}
	}
	cc.UserTimeoutEnabled = e.boolean("USER_TIMEOUT_ENABLED", false)
	// ztunnel compares the exact string.
	cc.PolicyInfoLogging = e.str("AUTHZ_POLICY_INFO_LOGGING", "") == "true"
	switch v := e.str("COMPLIANCE_POLICY", ""); v {
	case "":
	case "pqc":
		cc.PQC = true
	default:
		e.fail("COMPLIANCE_POLICY", v, errors.New(`want "pqc" or unset`))
	}
	if v := e.str("TLS12_ENABLED", ""); v == "true" {
		e.fail("TLS12_ENABLED", v, errors.New("TLS 1.2 is not supported (HBONE and the control plane use TLS 1.3 only); unset it"))
	}
	if !e.boolean("ENABLE_PROXY", true) {
		e.fail("ENABLE_PROXY", "false", errors.New("running the DNS proxy alone is not supported; unset it"))
	}
	if !e.boolean("ENABLE_RESPONSE_BAGGAGE", true) {
		e.fail("ENABLE_RESPONSE_BAGGAGE", "false", errors.New("baggage is always sent and read as ztunnel's default does; unset it"))
	}
	if v := e.str("PROXY_CONFIG", ""); v != "" {
		e.fail("PROXY_CONFIG", v, errors.New("a ProxyConfig is not read; set the equivalent environment variables (XDS_ADDRESS, ISTIO_META_*, ...) instead"))
	}
	if fi, err := os.Stat(meshConfigPath); err == nil && fi.Size() > 0 {
		e.fail("PROXY_CONFIG", meshConfigPath, fmt.Errorf("the mesh config file %s is not read; remove it and set the equivalent environment variables instead", meshConfigPath))
	}
	cc.CPUResourceLimit = e.cpu("ZTUNNEL_RESOURCE_CPU_LIMIT")
	if v := e.str("ZTUNNEL_WORKER_THREADS", ""); v != "" {
		n, err := workerThreads(v, cpuCount(cc.CPUResourceLimit, c.CPULimit))
		if err != nil {
			e.fail("ZTUNNEL_WORKER_THREADS", v, err)
		}
		cc.WorkerThreads, cc.WorkerThreadsFrom = n, "ZTUNNEL_WORKER_THREADS"
	} else {
		cc.WorkerThreads = defaultWorkerThreads(cc.CPUResourceLimit, c.CPURequest, cpuCount(cc.CPUResourceLimit, c.CPULimit))
		cc.WorkerThreadsFrom = "default"
	}
}

// defaultWorkerThreads is ztunnel's default_worker_threads, the count when
// ZTUNNEL_WORKER_THREADS is unset: an explicit resource limit (the chart
// sets ZTUNNEL_RESOURCE_CPU_LIMIT only when resources.limits.cpu is) wins,
// raised to the request; otherwise a quarter of the CPUs, rounded up, and
// at least the request and 2.
func defaultWorkerThreads(resourceLimit, request float64, cpus int) int {
	req := int(math.Ceil(request))
	if resourceLimit > 0 {
		return max(int(math.Ceil(resourceLimit)), req)
	}
	return max(int(math.Ceil(float64(cpus)*defaultWorkerThreadFraction)), req, defaultWorkerThreadsFloor)
}

// ztunnel's DEFAULT_WORKER_THREAD_CPU_FRACTION and DEFAULT_WORKER_THREADS.
const (
	defaultWorkerThreadFraction = 0.25
	defaultWorkerThreadsFloor   = 2
)

// cpuCount is ztunnel's get_cpu_count: the resource limit rounded up, else
// ZTUNNEL_CPU_LIMIT, else the logical CPUs.
func cpuCount(resourceLimit, cpuLimit float64) int {
	switch {
	case resourceLimit > 0:
		return int(math.Ceil(resourceLimit))
	case cpuLimit > 0:
		return int(math.Ceil(cpuLimit))
	}
	return runtime.NumCPU()
}

// workerThreads parses ZTUNNEL_WORKER_THREADS as ztunnel does: "N%" of cpus
// rounded up (at least 1), a fixed N, or 0 for all cpus.
func workerThreads(v string, cpus int) (int, error) {
	if pct, ok := strings.CutSuffix(v, "%"); ok {
		p, err := strconv.ParseFloat(pct, 64)
		if err != nil {
			return 0, errors.New("invalid percentage")
		}
		if !(p > 0 && p <= 100) {
			return 0, errors.New("percentage must be between 0 and 100")
		}
		return max(1, int(math.Ceil(float64(cpus)*p/100))), nil
	}
	n, err := strconv.ParseUint(v, 10, 16)
	if err != nil {
		return 0, errors.New("want a number of threads or a percentage such as 50%")
	}
	if n == 0 {
		return cpus, nil
	}
	return int(n), nil
}

// ApplyWorkerThreads sets GOMAXPROCS to ZTUNNEL_WORKER_THREADS (ztunnel's
// worker thread count, or its default), unless the operator set GOMAXPROCS itself, and
// returns the value in force.
func ApplyWorkerThreads(cfg *Config, lookup func(string) (string, bool)) int {
	if _, set := lookup("GOMAXPROCS"); cfg.WorkerThreads > 0 && !set {
		runtime.GOMAXPROCS(cfg.WorkerThreads)
	}
	return runtime.GOMAXPROCS(0)
}

// bindHost is the proxies' listener host: [::] (dual stack), or 0.0.0.0
// with IPV6_ENABLED=false.
func bindHost(cfg *Config) string {
	if cfg.IPv6Enabled {
		return "::"
	}
	return "0.0.0.0"
}

// reusePort reports whether listeners set SO_REUSEPORT: INPOD_PORT_REUSE,
// in shared mode only, as ztunnel sets it only on in-pod sockets. There it
// lets the next daemon of an upgrade join the pods' ports (and the
// self-proxy's 15008); a dedicated daemon has no such upgrade, and with
// SO_REUSEPORT a port held by another socket of the same user that set it
// too would be shared with that stranger instead of failing the start.
func reusePort(cfg *Config) bool {
	return cfg.Mode == ModeShared && cfg.PortReuse
}

// userTimeout is TCP_USER_TIMEOUT for proxied sockets with
// USER_TIMEOUT_ENABLED (ztunnel's formula, from the KEEPALIVE_* values
// whether keepalive is on or not), else 0.
func userTimeout(cfg *Config) time.Duration {
	if !cfg.UserTimeoutEnabled {
		return 0
	}
	return cfg.KeepAliveTime + time.Duration(cfg.KeepAliveRetries)*cfg.KeepAliveInterval
}

// controlPlaneCurves is the TLS key exchange with istiod (xDS and CA):
// X25519MLKEM768 only with COMPLIANCE_POLICY=pqc, as ztunnel's provider
// applies to every connection; nil (Go's default) otherwise.
func controlPlaneCurves(cfg *Config) []tls.CurveID {
	if cfg.PQC {
		return []tls.CurveID{tls.X25519MLKEM768}
	}
	return nil
}
