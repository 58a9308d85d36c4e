package app

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/logging"
)

// Mode is PROXY_MODE.
type Mode string

// Proxy modes.
const (
	ModeShared    Mode = "shared"
	ModeDedicated Mode = "dedicated"
)

// Config is the daemon's whole configuration, parsed from ztunnel's
// environment variables. Zero values are filled by ParseEnv with ztunnel's
// defaults.
type Config struct {
	Mode Mode
	// Workload is PROXY_WORKLOAD_INFO (namespace/name/service-account).
	Workload struct{ Namespace, Name, ServiceAccount string }

	LocalXDSPath string // LOCAL_XDS_PATH
	LocalXDS     string `json:"-"` // LOCAL_XDS (inline YAML); not serialized, as ztunnel skips its local config source
	XDSAddress   string // XDS_ADDRESS ("" = no control plane)
	CAAddress    string // CA_ADDRESS
	// XDSRootCA and CARootCA verify istiod: a PEM file, "SYSTEM" or inline PEM.
	XDSRootCA, CARootCA string
	// AltXDSHostname and AltCAHostname are accepted in istiod's certificate
	// besides the address's host.
	AltXDSHostname, AltCAHostname string
	// AuthToken is AUTH_TOKEN: a token file (re-read on every call) or a
	// static token; "" uses the projected token file when it exists. Never
	// serialized (the config dump, the start log), as ztunnel skips its
	// auth source: it may be a bearer token.
	AuthToken string `json:"-"`
	// XDSOnDemand is XDS_ON_DEMAND: Address resources fetched when needed.
	XDSOnDemand bool

	FakeCA        bool   // FAKE_CA, or implied by a local config without CA_ADDRESS
	BuiltinCACert string // BUILTIN_CA_CERT: PEM file of the built-in CA's root
	BuiltinCAKey  string // BUILTIN_CA_KEY: PEM file of its key
	SecretTTL     time.Duration
	// CRLPath is CRL_PATH: a file of certificate revocation lists (PEM or
	// DER) enforced on HBONE peers both ways and reloaded on change; ""
	// enforces none.
	CRLPath string

	ClusterID   string
	TrustDomain string
	NodeName    string
	Network     string
	PacketMark  uint32 // 0 = unset
	OrigSrc     *bool  // ENABLE_ORIG_SRC: nil = best effort
	PortReuse   bool   // INPOD_PORT_REUSE
	InpodUDS    string // INPOD_UDS: the CNI agent's ZDS socket (shared mode)
	// EnableSOCKS5 is UNSTABLE_ENABLE_SOCKS5: a SOCKS5 listener on
	// 127.0.0.1:15080 in each pod.
	EnableSOCKS5 bool
	// LocalhostAppTunnel is LOCALHOST_APP_TUNNEL: PROXY-protocol
	// application tunnels are dialed over loopback (default true).
	LocalhostAppTunnel bool

	StreamWindow        uint32 // HTTP2_STREAM_WINDOW_SIZE
	ConnectionWindow    uint32 // HTTP2_CONNECTION_WINDOW_SIZE
	FrameSize           uint32 // HTTP2_FRAME_SIZE
	PoolMaxStreams      int    // POOL_MAX_STREAMS_PER_CONNECTION
	PoolUnusedRelease   time.Duration
	TerminationDeadline time.Duration // CONNECTION_TERMINATION_DEADLINE (or the grace-period rule)

	// PoolInnerHBONE is ZTUNNEL_POOL_INNER_HBONE (ztunnel-go only, default
	// off): pool the inner tunnels of double HBONE, see
	// proxy.Config.PoolInnerHBONE.
	PoolInnerHBONE bool

	KeepAliveEnabled  bool
	KeepAliveTime     time.Duration
	KeepAliveInterval time.Duration
	KeepAliveRetries  int

	// AdminAddr, StatsAddr and ReadinessAddr are the ztunnel-pod listeners.
	AdminAddr     string
	StatsAddr     string
	ReadinessAddr string

	// The daemon's own pod (the chart's downward-API values): they name the
	// xDS node and the daemon's identity.
	PodName, PodNamespace, ServiceAccount string
	InstanceIP                            string // INSTANCE_IP, default 1.1.1.1
	// CPULimit and CPURequest are ZTUNNEL_CPU_LIMIT and
	// ZTUNNEL_RESOURCE_CPU_REQUEST in cores (0 = unset). Go's runtime already
	// sizes GOMAXPROCS from the cgroup limit; these are validated and shown.
	CPULimit, CPURequest float64
	// IstioVersion is ISTIO_META_ISTIO_VERSION, the istio_build tag.
	IstioVersion string

	// DNSCapture is ISTIO_META_DNS_CAPTURE: run the DNS proxy for each
	// workload. Unset enables it, as in current ztunnel (the pods' capture
	// rules decide whether DNS reaches it); any value but "true" disables it.
	DNSCapture bool
	// DNSProxyAddrs are the DNS proxy's addresses in each workload's
	// namespace: ISTIO_META_DNS_PROXY_ADDR, "localhost:PORT" (both
	// loopbacks) or "IP:PORT"; default 127.0.0.1:15053 and [::1]:15053.
	DNSProxyAddrs []string
	// ClusterDomain is CLUSTER_DOMAIN, the DNS proxy's Kubernetes domain.
	ClusterDomain string
	// ResolvConf is ZTUNNEL_RESOLV_CONF (ours, not ztunnel's): the file the
	// DNS proxy's upstream resolvers and the on-demand lookups' nameservers
	// are read from, default /etc/resolv.conf.
	ResolvConf string

	// Engine is ZTUNNEL_ENGINE: the relay backend (auto, std, epoll, uring),
	// validated here and handed to engine.New (engine.go); once the daemon
	// has started it names the backend that runs.
	Engine string
	// EngineStreamWait is ZTUNNEL_ENGINE_STREAM_WAIT (ours): how the epoll
	// backend's TCP⇄stream loops wait, block (in epoll_wait, the default,
	// engine.Config.BlockStreamLoops: the loops own the HBONE connections
	// (proxy.LoopDrive) and are woken by their own sockets) or park (in the runtime's netpoller, the mode the
	// goroutine path was measured with).
	EngineStreamWait string

	// MemoryReleaseInterval is ZTUNNEL_MEMORY_RELEASE_INTERVAL (ours): at
	// most one return of freed memory to the OS per interval once a burst
	// has settled (release.go); 0 turns the releaser off. MemoryRelease
	// counts the releases, set once the releaser runs.
	MemoryReleaseInterval time.Duration
	MemoryRelease         *MemoryReleaseStats `json:",omitempty"`

	// FDBudget is ZTUNNEL_FD_BUDGET (ours): the descriptor budget every
	// proxy's accepted connections and inbound streams take from, per peer
	// (fdbudget): "auto" (the default: RLIMIT_NOFILE minus a reserve),
	// "off", or a number of descriptors. Once the daemon has started it
	// holds the total in force, or "off" (budget.go).
	FDBudget string

	// HBONEMaxHandshakesPerPeer and HBONEMaxConnsPerPeer are
	// ZTUNNEL_HBONE_MAX_HANDSHAKES_PER_PEER and
	// ZTUNNEL_HBONE_MAX_CONNS_PER_PEER (ours, default 0 = no cap, as
	// ztunnel): proxy.Config's MaxHBONEHandshakesPerPeer and
	// MaxHBONEConnsPerPeer, opt-in caps per source IP on 15008.
	HBONEMaxHandshakesPerPeer, HBONEMaxConnsPerPeer int

	// PreferredServiceNamespace is PREFERED_SERVICE_NAMESPACE (sic): the
	// tiebreak namespace for services sharing a VIP.
	PreferredServiceNamespace string

	LogLevel  string // RUST_LOG
	LogFormat string // LOG_FORMAT: plain or json

	Compat // env_compat.go: the remaining ztunnel variables
}

// envError names the variable a problem came from.
type envError struct {
	name, value string
	err         error
}

func (e *envError) Error() string {
	return fmt.Sprintf("environment variable %s=%q: %v", e.name, e.value, e.err)
}
func (e *envError) Unwrap() error { return e.err }

// env reads variables through a lookup function so tests need not touch
// the process environment.
type env struct {
	lookup func(string) (string, bool)
	errs   []error
}

func (e *env) str(name, def string) string {
	if v, ok := e.lookup(name); ok {
		return v
	}
	return def
}

func (e *env) fail(name, value string, err error) {
	e.errs = append(e.errs, &envError{name: name, value: value, err: err})
}

func (e *env) boolean(name string, def bool) bool {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.fail(name, v, errors.New("want true or false"))
		return def
	}
	return b
}

func (e *env) optBool(name string) *bool {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.fail(name, v, errors.New("want true or false"))
		return nil
	}
	return &b
}

func (e *env) uint(name string, def uint64, min, max uint64) uint64 {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		e.fail(name, v, errors.New("want a non-negative integer"))
		return def
	}
	if n < min || n > max {
		e.fail(name, v, fmt.Errorf("want a value in [%d, %d]", min, max))
		return def
	}
	return n
}

func (e *env) duration(name string, def time.Duration) time.Duration {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return def
	}
	d, err := parseDuration(v)
	if err != nil {
		e.fail(name, v, err)
		return def
	}
	return d
}

// positiveDuration is duration for a variable whose zero would mean
// nothing (a certificate valid for no time, a keepalive probe after no idle
// time) or silently fall back to a default: 0 is refused, naming it.
func (e *env) positiveDuration(name string, def time.Duration) time.Duration {
	d := e.duration(name, def)
	if d == 0 {
		v, _ := e.lookup(name)
		e.fail(name, v, errors.New("want a duration above zero"))
		return def
	}
	return d
}

// parseDuration accepts Go durations ("1m30s") and the forms ztunnel's
// duration_str takes for plain values ("5s", "10m", "1h", "500ms") and a bare
// number of seconds.
func parseDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		return 0, errors.New("want a duration such as 5s, 1m or 500ms")
	}
	if d < 0 {
		return 0, errors.New("want a non-negative duration")
	}
	return d, nil
}

// ParseEnv reads the configuration from lookup (os.LookupEnv in the daemon).
// Every malformed variable is reported, each naming the variable.
func ParseEnv(lookup func(string) (string, bool)) (*Config, error) {
	e := &env{lookup: lookup}
	c := &Config{}

	switch m := e.str("PROXY_MODE", string(ModeShared)); Mode(m) {
	case ModeShared, ModeDedicated:
		c.Mode = Mode(m)
	default:
		e.fail("PROXY_MODE", m, errors.New("want shared or dedicated"))
	}
	if info := e.str("PROXY_WORKLOAD_INFO", ""); info != "" {
		parts := strings.Split(info, "/")
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			e.fail("PROXY_WORKLOAD_INFO", info, errors.New("want namespace/name/service-account"))
		} else {
			c.Workload.Namespace, c.Workload.Name, c.Workload.ServiceAccount = parts[0], parts[1], parts[2]
		}
	}
	if c.Mode == ModeDedicated && c.Workload.Name == "" {
		if _, set := lookup("PROXY_WORKLOAD_INFO"); !set {
			e.fail("PROXY_WORKLOAD_INFO", "", errors.New("required when PROXY_MODE=dedicated"))
		}
	}

	c.LocalXDSPath = e.str("LOCAL_XDS_PATH", "")
	c.LocalXDS = e.str("LOCAL_XDS", "")
	if c.LocalXDSPath != "" && c.LocalXDS != "" {
		e.fail("LOCAL_XDS", "<inline>", errors.New("set LOCAL_XDS_PATH or LOCAL_XDS, not both"))
	}
	local := c.LocalXDSPath != "" || c.LocalXDS != ""
	// Without a local config ztunnel talks to istiod by default; with one,
	// only when asked to. In a pod (Kubernetes sets KUBERNETES_SERVICE_HOST)
	// istiod is its service; elsewhere, as ztunnel, one on this host.
	defXDS := ""
	if !local {
		defXDS = "https://localhost:15012"
		if _, inCluster := e.lookup("KUBERNETES_SERVICE_HOST"); inCluster {
			defXDS = "https://istiod.istio-system.svc:15012"
		}
	}
	c.XDSAddress = withScheme(e.str("XDS_ADDRESS", defXDS))
	c.CAAddress = withScheme(e.str("CA_ADDRESS", defXDS))
	c.XDSRootCA = e.str("XDS_ROOT_CA", defaultRootCA)
	c.CARootCA = e.str("CA_ROOT_CA", defaultRootCA)
	c.AltXDSHostname = e.str("ALT_XDS_HOSTNAME", "")
	c.AltCAHostname = e.str("ALT_CA_HOSTNAME", "")
	c.AuthToken = e.str("AUTH_TOKEN", "")
	c.XDSOnDemand = e.boolean("XDS_ON_DEMAND", false)
	c.FakeCA = e.boolean("FAKE_CA", false)
	if !c.FakeCA && c.CAAddress == "" && local {
		c.FakeCA = true
	}
	c.BuiltinCACert = e.str("BUILTIN_CA_CERT", "")
	c.BuiltinCAKey = e.str("BUILTIN_CA_KEY", "")
	if (c.BuiltinCACert == "") != (c.BuiltinCAKey == "") {
		e.fail("BUILTIN_CA_KEY", c.BuiltinCAKey, errors.New("BUILTIN_CA_CERT and BUILTIN_CA_KEY go together"))
	}
	c.SecretTTL = e.positiveDuration("SECRET_TTL", 24*time.Hour)

	c.ClusterID = e.str("CLUSTER_ID", "Kubernetes")
	if v, ok := lookup("ISTIO_META_CLUSTER_ID"); ok && v != "" {
		c.ClusterID = v
	}
	c.TrustDomain = e.str("TRUST_DOMAIN", "cluster.local")
	if c.TrustDomain == "" || strings.ContainsAny(c.TrustDomain, "/ ") {
		e.fail("TRUST_DOMAIN", c.TrustDomain, errors.New("want a trust domain such as cluster.local"))
	}
	c.NodeName = e.str("NODE_NAME", "")
	c.Network = e.str("NETWORK", "")
	c.PreferredServiceNamespace = e.str("PREFERED_SERVICE_NAMESPACE", "")
	defMark := uint64(0)
	if c.Mode == ModeShared {
		defMark = 1337
	}
	c.PacketMark = uint32(e.uint("PACKET_MARK", defMark, 0, math.MaxUint32))
	c.OrigSrc = e.optBool("ENABLE_ORIG_SRC")
	c.PortReuse = e.boolean("INPOD_PORT_REUSE", true)
	c.InpodUDS = e.str("INPOD_UDS", "/var/run/ztunnel/ztunnel.sock")
	c.EnableSOCKS5 = e.boolean("UNSTABLE_ENABLE_SOCKS5", false)
	c.LocalhostAppTunnel = e.boolean("LOCALHOST_APP_TUNNEL", true)

	c.StreamWindow = uint32(e.uint("HTTP2_STREAM_WINDOW_SIZE", 4<<20, 1, math.MaxInt32))
	c.ConnectionWindow = uint32(e.uint("HTTP2_CONNECTION_WINDOW_SIZE", 16<<20, 1, math.MaxInt32))
	c.FrameSize = uint32(e.uint("HTTP2_FRAME_SIZE", 1<<20, 16384, 1<<24-1))
	c.PoolMaxStreams = int(e.uint("POOL_MAX_STREAMS_PER_CONNECTION", 100, 1, math.MaxUint16))
	c.PoolUnusedRelease = e.positiveDuration("POOL_UNUSED_RELEASE_TIMEOUT", 5*time.Minute)
	c.PoolInnerHBONE = e.boolean("ZTUNNEL_POOL_INNER_HBONE", false)

	c.TerminationDeadline = 5 * time.Second
	if _, ok := lookup("CONNECTION_TERMINATION_DEADLINE"); ok {
		c.TerminationDeadline = e.duration("CONNECTION_TERMINATION_DEADLINE", 5*time.Second)
	} else if v, ok := lookup("TERMINATION_GRACE_PERIOD_SECONDS"); ok && v != "" {
		grace := e.uint("TERMINATION_GRACE_PERIOD_SECONDS", 0, 0, math.MaxUint32)
		c.TerminationDeadline = graceDeadline(time.Duration(grace) * time.Second)
	}

	c.KeepAliveEnabled = e.boolean("KEEPALIVE_ENABLED", true)
	c.KeepAliveTime = e.positiveDuration("KEEPALIVE_TIME", 180*time.Second)
	c.KeepAliveInterval = e.positiveDuration("KEEPALIVE_INTERVAL", 180*time.Second)
	c.KeepAliveRetries = int(e.uint("KEEPALIVE_RETRIES", 9, 1, 255))

	c.PodName = e.str("POD_NAME", "")
	c.PodNamespace = e.str("POD_NAMESPACE", "")
	c.ServiceAccount = e.str("SERVICE_ACCOUNT", "")
	c.InstanceIP = e.str("INSTANCE_IP", "1.1.1.1")
	if _, err := netip.ParseAddr(c.InstanceIP); err != nil {
		e.fail("INSTANCE_IP", c.InstanceIP, errors.New("want an IP address"))
	}
	c.CPULimit = e.cpu("ZTUNNEL_CPU_LIMIT")
	c.CPURequest = e.cpu("ZTUNNEL_RESOURCE_CPU_REQUEST")
	c.IstioVersion = e.str("ISTIO_META_ISTIO_VERSION", "")
	// Set by Istio's chart and ignored by ztunnel too.
	_ = e.str("INPOD_ENABLED", "")
	_ = e.str("RUST_BACKTRACE", "")
	c.CRLPath = e.str("CRL_PATH", "")

	c.DNSCapture = true
	if v, ok := lookup("ISTIO_META_DNS_CAPTURE"); ok {
		c.DNSCapture = strings.EqualFold(v, "true")
	}
	dnsAddr := e.str("ISTIO_META_DNS_PROXY_ADDR", "localhost:15053")
	if addrs, err := parseDNSProxyAddr(dnsAddr); err != nil {
		e.fail("ISTIO_META_DNS_PROXY_ADDR", dnsAddr, err)
	} else {
		c.DNSProxyAddrs = addrs
	}
	if c.DNSCapture && c.XDSOnDemand {
		e.fail("XDS_ON_DEMAND", "true", errors.New("DNS proxy does not currently support on-demand mode (ztunnel refuses it too); set ISTIO_META_DNS_CAPTURE=false to use it"))
	}
	c.ClusterDomain = e.str("CLUSTER_DOMAIN", "cluster.local")
	if c.ClusterDomain == "" || strings.ContainsAny(c.ClusterDomain, "/: ") {
		e.fail("CLUSTER_DOMAIN", c.ClusterDomain, errors.New("want a DNS domain such as cluster.local"))
	}
	c.ResolvConf = e.str("ZTUNNEL_RESOLV_CONF", "/etc/resolv.conf")

	c.AdminAddr = e.str("ZTUNNEL_ADMIN_ADDR", "localhost:15000")
	c.StatsAddr = e.str("ZTUNNEL_STATS_ADDR", "[::]:15020")
	c.ReadinessAddr = e.str("ZTUNNEL_READINESS_ADDR", "[::]:15021")
	if err := checkAdminAddr(c.AdminAddr); err != nil {
		e.fail("ZTUNNEL_ADMIN_ADDR", c.AdminAddr, err)
	}

	switch c.Engine = e.str("ZTUNNEL_ENGINE", "auto"); c.Engine {
	case "", "auto", "std", "epoll", "uring":
	default:
		e.fail("ZTUNNEL_ENGINE", c.Engine, errors.New("want auto, std, epoll or uring"))
	}
	switch c.EngineStreamWait = e.str("ZTUNNEL_ENGINE_STREAM_WAIT", "block"); c.EngineStreamWait {
	case "park", "block":
	default:
		e.fail("ZTUNNEL_ENGINE_STREAM_WAIT", c.EngineStreamWait, errors.New("want park or block"))
	}
	c.MemoryReleaseInterval = e.duration("ZTUNNEL_MEMORY_RELEASE_INTERVAL", DefaultMemoryReleaseInterval)
	switch c.FDBudget = e.str("ZTUNNEL_FD_BUDGET", "auto"); c.FDBudget {
	case "":
		c.FDBudget = "auto"
	case "auto", "off":
	default:
		if n, err := strconv.Atoi(c.FDBudget); err != nil || n < 1 {
			e.fail("ZTUNNEL_FD_BUDGET", c.FDBudget, errors.New("want auto, off or a number of descriptors"))
		}
	}
	// Opt-in per-source caps on 15008 (ztunnel has none); 0 is no cap.
	c.HBONEMaxHandshakesPerPeer = int(e.uint("ZTUNNEL_HBONE_MAX_HANDSHAKES_PER_PEER", 0, 0, math.MaxInt32))
	c.HBONEMaxConnsPerPeer = int(e.uint("ZTUNNEL_HBONE_MAX_CONNS_PER_PEER", 0, 0, math.MaxInt32))

	c.LogLevel = e.str("RUST_LOG", "info")
	c.LogFormat = e.str("LOG_FORMAT", "plain")
	if c.LogFormat != "plain" && c.LogFormat != "json" {
		e.fail("LOG_FORMAT", c.LogFormat, errors.New("want plain or json"))
	}
	if _, err := logging.NewLevels(c.LogLevel); err != nil {
		e.fail("RUST_LOG", c.LogLevel, err)
	}
	e.parseCompat(c) // env_compat.go
	if len(e.errs) > 0 {
		return nil, errors.Join(e.errs...)
	}
	return c, nil
}

// defaultRootCA is where the chart mounts istiod's root certificate.
const defaultRootCA = "./var/run/secrets/istio/root-cert.pem"

// defaultTokenPath is where the chart projects the daemon's JWT.
const defaultTokenPath = "./var/run/secrets/tokens/istio-token"

// withScheme adds https:// to an address without a scheme, as ztunnel does.
func withScheme(addr string) string {
	if addr == "" || strings.Contains(addr, "://") {
		return addr
	}
	return "https://" + addr
}

// cpu parses a Kubernetes CPU quantity: "2", "1.5" or "500m".
func (e *env) cpu(name string) float64 {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return 0
	}
	num, milli := strings.CutSuffix(v, "m")
	f, err := strconv.ParseFloat(num, 64)
	// NaN and infinities parse as floats but are no quantity (found by
	// FuzzParseEnv).
	if err != nil || !(f >= 0) || math.IsInf(f, 0) {
		e.fail(name, v, errors.New("want a CPU quantity such as 2, 1.5 or 500m"))
		return 0
	}
	if milli {
		f /= 1000
	}
	return f
}

// graceDeadline is ztunnel's rule: with a pod grace period, leave 5s of it
// for the rest of shutdown when it is long enough, else 1s; at least 1s.
func graceDeadline(grace time.Duration) time.Duration {
	var d time.Duration
	if grace > 10*time.Second {
		d = grace - 5*time.Second
	} else {
		d = grace - time.Second
	}
	return max(d, time.Second)
}

// checkAdminAddr keeps the admin server off the network: its host must be
// a loopback address or "localhost".
func checkAdminAddr(addr string) error {
	host, _, err := splitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return errors.New("the admin server must listen on a loopback address")
	}
	return nil
}

// parseDNSProxyAddr reads DNS_PROXY_ADDR as ztunnel does: "localhost:PORT"
// means both loopbacks, anything else must be one IP:PORT.
func parseDNSProxyAddr(v string) ([]string, error) {
	if port, ok := strings.CutPrefix(v, "localhost:"); ok {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, errors.New("want localhost:PORT or IP:PORT")
		}
		p := strconv.FormatUint(n, 10)
		return []string{"127.0.0.1:" + p, "[::1]:" + p}, nil
	}
	ap, err := netip.ParseAddrPort(v)
	if err != nil || ap.Addr().Zone() != "" {
		return nil, errors.New("want localhost:PORT or IP:PORT")
	}
	return []string{ap.String()}, nil
}
