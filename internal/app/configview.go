package app

import (
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/controlplane"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/proxy"
)

// What an operator reads of the configuration, /config_dump's "config" and
// the start-up line "running with config:", in ztunnel's shape: its Config
// serialized by serde (camelCase keys, std Durations as {"secs", "nanos"},
// enums externally tagged: {"Localhost": [ipv6, port]}, {"SocketAddr":
// "ip:port"}, {"File": path}, "Shared"), so `jq .config.proxyMode` written
// for ztunnel reads the same here. Settings ztunnel does not have are under
// one key of our own, "ztunnelGo". Secrets stay out (AUTH_TOKEN, an inline
// LOCAL_XDS), as ztunnel skips its auth and local config sources.

// ztunnelDuration is a std::time::Duration as serde writes it.
type ztunnelDuration struct {
	Secs  int64 `json:"secs"`
	Nanos int32 `json:"nanos"`
}

func durationOf(d time.Duration) ztunnelDuration {
	return ztunnelDuration{Secs: int64(d / time.Second), Nanos: int32(d % time.Second)}
}

// ztunnelWorkloadInfo is ztunnel's state::WorkloadInfo.
type ztunnelWorkloadInfo struct {
	Name           string `json:"name"`
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
}

// ztunnelSocketConfig is ztunnel's SocketConfig.
type ztunnelSocketConfig struct {
	KeepaliveTime      ztunnelDuration `json:"keepaliveTime"`
	KeepaliveInterval  ztunnelDuration `json:"keepaliveInterval"`
	KeepaliveRetries   int             `json:"keepaliveRetries"`
	KeepaliveEnabled   bool            `json:"keepaliveEnabled"`
	UserTimeoutEnabled bool            `json:"userTimeoutEnabled"`
}

// ztunnelConfig is ztunnel's Config (src/config.rs) as serde serializes it,
// key for key in its order, and our own settings under "ztunnelGo".
type ztunnelConfig struct {
	Proxy                    bool                 `json:"proxy"`
	DNSProxy                 bool                 `json:"dnsProxy"`
	WindowSize               uint32               `json:"windowSize"`
	ConnectionWindowSize     uint32               `json:"connectionWindowSize"`
	FrameSize                uint32               `json:"frameSize"`
	PoolMaxStreamsPerConn    int                  `json:"poolMaxStreamsPerConn"`
	PoolUnusedReleaseTimeout ztunnelDuration      `json:"poolUnusedReleaseTimeout"`
	Socks5Addr               *string              `json:"socks5Addr"`
	AdminAddr                any                  `json:"adminAddr"`
	StatsAddr                any                  `json:"statsAddr"`
	ReadinessAddr            any                  `json:"readinessAddr"`
	InboundAddr              string               `json:"inboundAddr"`
	InboundPlaintextAddr     string               `json:"inboundPlaintextAddr"`
	OutboundAddr             string               `json:"outboundAddr"`
	DNSProxyAddr             any                  `json:"dnsProxyAddr"`
	IllegalPorts             []int                `json:"illegalPorts"`
	Network                  string               `json:"network"`
	LocalNode                *string              `json:"localNode"`
	ProxyMode                string               `json:"proxyMode"`
	ProxyWorkloadInformation *ztunnelWorkloadInfo `json:"proxyWorkloadInformation"`
	ClusterID                string               `json:"clusterId"`
	ClusterDomain            string               `json:"clusterDomain"`
	CAAddress                *string              `json:"caAddress"`
	CARootCert               any                  `json:"caRootCert"`
	AltCAHostname            *string              `json:"altCaHostname"`
	XDSAddress               *string              `json:"xdsAddress"`
	XDSRootCert              any                  `json:"xdsRootCert"`
	AltXDSHostname           *string              `json:"altXdsHostname"`
	PreferedServiceNamespace *string              `json:"preferedServiceNamespace"`
	SecretTTL                ztunnelDuration      `json:"secretTtl"`
	XDSOnDemand              bool                 `json:"xdsOnDemand"`
	FakeCA                   bool                 `json:"fakeCa"`
	FakeSelfInbound          bool                 `json:"fakeSelfInbound"`
	SelfTerminationDeadline  ztunnelDuration      `json:"selfTerminationDeadline"`
	ProxyMetadata            map[string]string    `json:"proxyMetadata"`
	NumWorkerThreads         int                  `json:"numWorkerThreads"`
	RequireOriginalSource    *bool                `json:"requireOriginalSource"`
	ProxyArgs                string               `json:"proxyArgs"`
	InpodUDS                 string               `json:"inpodUds"`
	InpodPortReuse           bool                 `json:"inpodPortReuse"`
	PacketMark               *uint32              `json:"packetMark"`
	SocketConfig             ztunnelSocketConfig  `json:"socketConfig"`
	XDSHeaders               [][2]string          `json:"xdsHeaders"`
	CAHeaders                [][2]string          `json:"caHeaders"`
	LocalhostAppTunnel       bool                 `json:"localhostAppTunnel"`
	ZtunnelIdentity          *string              `json:"ztunnelIdentity"`
	ZtunnelWorkload          *ztunnelWorkloadInfo `json:"ztunnelWorkload"`
	IPv6Enabled              bool                 `json:"ipv6Enabled"`
	CRLPath                  *string              `json:"crlPath"`
	EnableEnhancedBaggage    bool                 `json:"enableEnhancedBaggage"`
	Ours                     ztunnelGoConfig      `json:"ztunnelGo"`
}

// ztunnelGoConfig is what this build has that ztunnel's Config does not.
type ztunnelGoConfig struct {
	TrustDomain               string              `json:"trustDomain"`
	LocalXDSPath              string              `json:"localXdsPath,omitempty"`
	BuiltinCACert             string              `json:"builtinCaCert,omitempty"`
	BuiltinCAKey              string              `json:"builtinCaKey,omitempty"`
	InstanceIP                string              `json:"instanceIp"`
	CPULimit                  float64             `json:"cpuLimit,omitempty"`
	CPURequest                float64             `json:"cpuRequest,omitempty"`
	CPUResourceLimit          float64             `json:"cpuResourceLimit,omitempty"`
	WorkerThreadsFrom         string              `json:"workerThreadsFrom"`
	IstioVersion              string              `json:"istioVersion,omitempty"`
	ResolvConf                string              `json:"resolvConf"`
	Engine                    string              `json:"engine"`
	EngineStreamWait          string              `json:"engineStreamWait"`
	PoolInnerHBONE            bool                `json:"poolInnerHbone"`
	MemoryReleaseInterval     ztunnelDuration     `json:"memoryReleaseInterval"`
	MemoryRelease             *MemoryReleaseStats `json:"memoryRelease,omitempty"`
	FDBudget                  string              `json:"fdBudget"`
	HBONEMaxHandshakesPerPeer int                 `json:"hboneMaxHandshakesPerPeer"`
	HBONEMaxConnsPerPeer      int                 `json:"hboneMaxConnsPerPeer"`
	PolicyInfoLogging         bool                `json:"policyInfoLogging"`
	PQC                       bool                `json:"pqc"`
	LogLevel                  string              `json:"logLevel"`
	LogFormat                 string              `json:"logFormat"`
}

// ztunnelView returns cfg as ztunnel shows its configuration; environ and
// args are the process's (for proxyMetadata, the header variables and
// proxyArgs).
func ztunnelView(cfg *Config, environ, args []string) *ztunnelConfig {
	wild := bindHost(cfg)
	sock := func(port int) string { return net.JoinHostPort(wild, strconv.Itoa(port)) }
	v := &ztunnelConfig{
		Proxy: true, DNSProxy: cfg.DNSCapture,
		WindowSize: cfg.StreamWindow, ConnectionWindowSize: cfg.ConnectionWindow, FrameSize: cfg.FrameSize,
		PoolMaxStreamsPerConn:    cfg.PoolMaxStreams,
		PoolUnusedReleaseTimeout: durationOf(cfg.PoolUnusedRelease),
		AdminAddr:                addressOf(cfg.AdminAddr, cfg.IPv6Enabled),
		StatsAddr:                addressOf(cfg.StatsAddr, cfg.IPv6Enabled),
		ReadinessAddr:            addressOf(cfg.ReadinessAddr, cfg.IPv6Enabled),
		InboundAddr:              sock(proxy.InboundHBONEPort),
		InboundPlaintextAddr:     sock(proxy.InboundPlainPort),
		OutboundAddr:             sock(proxy.OutboundPort),
		DNSProxyAddr:             dnsAddressOf(cfg.DNSProxyAddrs, cfg.IPv6Enabled),
		IllegalPorts:             []int{proxy.OutboundPort, proxy.InboundPlainPort, proxy.InboundHBONEPort},
		Network:                  cfg.Network,
		LocalNode:                optional(cfg.NodeName),
		ProxyMode:                "Shared",
		ClusterID:                cfg.ClusterID, ClusterDomain: cfg.ClusterDomain,
		CARootCert: rootCertOf(cfg.CARootCA), AltCAHostname: optional(cfg.AltCAHostname),
		XDSAddress: optional(cfg.XDSAddress), XDSRootCert: rootCertOf(cfg.XDSRootCA), AltXDSHostname: optional(cfg.AltXDSHostname),
		PreferedServiceNamespace: optional(cfg.PreferredServiceNamespace),
		SecretTTL:                durationOf(cfg.SecretTTL),
		XDSOnDemand:              cfg.XDSOnDemand,
		FakeCA:                   cfg.FakeCA,
		SelfTerminationDeadline:  durationOf(cfg.TerminationDeadline),
		ProxyMetadata:            proxyMetadata(environ, nil),
		NumWorkerThreads:         cfg.WorkerThreads,
		RequireOriginalSource:    cfg.OrigSrc,
		InpodUDS:                 cfg.InpodUDS, InpodPortReuse: cfg.PortReuse,
		SocketConfig: ztunnelSocketConfig{
			KeepaliveTime: durationOf(cfg.KeepAliveTime), KeepaliveInterval: durationOf(cfg.KeepAliveInterval),
			KeepaliveRetries: cfg.KeepAliveRetries, KeepaliveEnabled: cfg.KeepAliveEnabled, UserTimeoutEnabled: cfg.UserTimeoutEnabled,
		},
		XDSHeaders:            headerPairs(environ, "XDS_HEADER_"),
		CAHeaders:             headerPairs(environ, "CA_HEADER_"),
		LocalhostAppTunnel:    cfg.LocalhostAppTunnel,
		IPv6Enabled:           cfg.IPv6Enabled,
		CRLPath:               optional(cfg.CRLPath),
		EnableEnhancedBaggage: true, // ENABLE_RESPONSE_BAGGAGE=false is refused
		Ours: ztunnelGoConfig{
			TrustDomain: cfg.TrustDomain, LocalXDSPath: cfg.LocalXDSPath,
			BuiltinCACert: cfg.BuiltinCACert, BuiltinCAKey: cfg.BuiltinCAKey, InstanceIP: cfg.InstanceIP,
			CPULimit: cfg.CPULimit, CPURequest: cfg.CPURequest, CPUResourceLimit: cfg.CPUResourceLimit,
			WorkerThreadsFrom: cfg.WorkerThreadsFrom, IstioVersion: cfg.IstioVersion, ResolvConf: cfg.ResolvConf,
			Engine: cfg.Engine, EngineStreamWait: cfg.EngineStreamWait, PoolInnerHBONE: cfg.PoolInnerHBONE,
			MemoryReleaseInterval: durationOf(cfg.MemoryReleaseInterval), MemoryRelease: cfg.MemoryRelease, FDBudget: cfg.FDBudget,
			HBONEMaxHandshakesPerPeer: cfg.HBONEMaxHandshakesPerPeer, HBONEMaxConnsPerPeer: cfg.HBONEMaxConnsPerPeer,
			PolicyInfoLogging: cfg.PolicyInfoLogging, PQC: cfg.PQC, LogLevel: cfg.LogLevel, LogFormat: cfg.LogFormat,
		},
	}
	if cfg.EnableSOCKS5 {
		s := net.JoinHostPort("127.0.0.1", strconv.Itoa(proxy.SOCKS5Port))
		v.Socks5Addr = &s
		v.IllegalPorts = append(v.IllegalPorts, proxy.SOCKS5Port)
	}
	slices.Sort(v.IllegalPorts)
	if cfg.Mode == ModeDedicated {
		v.ProxyMode = "Dedicated"
		w := cfg.Workload
		v.ProxyWorkloadInformation = &ztunnelWorkloadInfo{Name: w.Name, Namespace: w.Namespace, ServiceAccount: w.ServiceAccount}
	}
	if !cfg.FakeCA {
		// ztunnel: None with the fake CA, never "" in its place.
		v.CAAddress = optional(cfg.CAAddress)
	}
	if len(args) > 1 {
		v.ProxyArgs = strings.Join(args[1:], " ")
	}
	if cfg.PacketMark != 0 {
		m := cfg.PacketMark
		v.PacketMark = &m
	}
	if cfg.PodNamespace != "" && cfg.ServiceAccount != "" && cfg.PodName != "" {
		id := identity.New(cfg.TrustDomain, cfg.PodNamespace, cfg.ServiceAccount).String()
		v.ZtunnelIdentity = &id
		v.ZtunnelWorkload = &ztunnelWorkloadInfo{Name: cfg.PodName, Namespace: cfg.PodNamespace, ServiceAccount: cfg.ServiceAccount}
	}
	return v
}

// optional is ztunnel's Option<String>: null when unset.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// addressOf is ztunnel's config::Address for a listener setting:
// "localhost:PORT" binds both loopbacks (Localhost(ipv6_enabled, port)),
// anything else one socket address.
func addressOf(addr string, ipv6 bool) any {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return map[string]string{"SocketAddr": addr}
	}
	p, _ := strconv.Atoi(port)
	if host == "localhost" {
		return map[string][]any{"Localhost": {ipv6, p}}
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return map[string]string{"SocketAddr": netip.AddrPortFrom(ip, uint16(p)).String()}
	}
	return map[string]string{"SocketAddr": addr}
}

// dnsAddressOf is the DNS proxy's Address: both loopbacks on one port are
// ztunnel's Localhost, one address its SocketAddr.
func dnsAddressOf(addrs []string, ipv6 bool) any {
	if len(addrs) == 0 {
		return nil
	}
	ports := map[string]bool{}
	loopbacks := 0
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		ports[port] = true
		if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
			loopbacks++
		}
	}
	if loopbacks == len(addrs) && len(ports) == 1 && (len(addrs) == 2 || !ipv6) {
		_, port, _ := net.SplitHostPort(addrs[0])
		return addressOf(net.JoinHostPort("localhost", port), ipv6)
	}
	return addressOf(addrs[0], ipv6)
}

// rootCertOf is ztunnel's RootCert for XDS_ROOT_CA / CA_ROOT_CA: a file,
// the system roots ("SYSTEM": Default), or inline PEM (Static, whose bytes
// serde skips).
func rootCertOf(v string) any {
	switch {
	case v == "SYSTEM":
		return "Default"
	case strings.Contains(v, "-----BEGIN"):
		return map[string][]any{"Static": {}}
	}
	return map[string]string{"File": v}
}

// headerPairs are ztunnel's MetadataVector: [name, value] pairs of the
// prefixed variables, in name order (a bad one fails the start elsewhere).
func headerPairs(environ []string, prefix string) [][2]string {
	h, err := controlplane.HeadersFromEnv(environ, prefix)
	out := [][2]string{}
	if err != nil {
		return out
	}
	for k, v := range h {
		out = append(out, [2]string{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

// processView is ztunnelView for this process.
func processView(cfg *Config) *ztunnelConfig { return ztunnelView(cfg, os.Environ(), os.Args) }

// liveView is /config_dump's "config": the view made when a dump is
// written, so what changes after start (the engine that runs, the memory
// releaser's counts) is current.
type liveView struct{ cfg *Config }

// MarshalJSON writes the view of the configuration as it is now.
func (l liveView) MarshalJSON() ([]byte, error) { return json.Marshal(processView(l.cfg)) }
