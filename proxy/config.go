package proxy

import (
	"log/slog"
	"net"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/fdbudget"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/proxy/connmgr"
	"github.com/ztunnel-go/ztunnel/state"
)

// Ports of the listeners a proxy opens in its pod's network namespace.
const (
	OutboundPort     = 15001
	InboundPlainPort = 15006
	InboundHBONEPort = 15008
	// SOCKS5Port is the optional SOCKS5 listener (UNSTABLE_ENABLE_SOCKS5),
	// bound to 127.0.0.1 only, as ztunnel does.
	SOCKS5Port = 15080
)

// WorkloadRef names the workload a proxy serves (PROXY_WORKLOAD_INFO in
// dedicated mode, the ZDS workload info in shared mode).
type WorkloadRef struct {
	Namespace, Name, ServiceAccount string
	// Node and Cluster scope the lookup of the workload record to this
	// node (NODE_NAME) and cluster (CLUSTER_ID), as ztunnel's local_node:
	// a same-named pod elsewhere is never taken for it. "" matches any.
	Node, Cluster string
}

func (r WorkloadRef) String() string { return r.Namespace + "/" + r.Name }

// Info is the snapshot lookup key of the workload.
func (r WorkloadRef) Info() state.WorkloadInfo {
	return state.WorkloadInfo{Namespace: r.Namespace, Name: r.Name, ServiceAccount: r.ServiceAccount, Node: r.Node, Cluster: r.Cluster}
}

// Config configures one proxy instance: the listeners and decisions for one
// workload.
type Config struct {
	// Workload is the workload this proxy serves.
	Workload WorkloadRef
	// TrustDomain is the trust domain of the served workload's identity when
	// the workload record does not say (default cluster.local).
	TrustDomain string
	// Network is this node's network (NETWORK).
	Network string
	// State is the published workload/service/policy snapshot.
	State *state.Store
	// Certs supplies workload certificates.
	Certs *mtls.Store
	// Pool carries outbound HBONE streams. Shared between proxies of a node
	// is fine: keys include the source identity and IP.
	Pool *hbone.Pool
	// HBONE tunes the inbound HTTP/2 server.
	HBONE hbone.Config
	// PoolInnerHBONE pools the inner tunnel of double HBONE
	// (ZTUNNEL_POOL_INNER_HBONE; ztunnel never does): inner connections to
	// one destination through one gateway carry many streams instead of one
	// TLS handshake each. Only used when the destination is a known HBONE
	// workload, whose ztunnel treats every inner CONNECT on its own; the
	// cost is that the gateway balances connections, not streams, so the
	// streams of one inner connection all reach the endpoint it chose first.
	PoolInnerHBONE bool
	// Engine runs the relays. The daemon makes one and hands it to every
	// proxy (the in-pod manager's per-pod proxies too) and closes it after
	// they are drained. Nil gives the proxy an engine of its own
	// (engine.Config{}), closed when the proxy is.
	Engine *engine.Engine
	// WatchListeners serves the listeners from the engine's watcher
	// (engine.Engine.WatchReadable: one goroutine for every listener of every
	// pod) instead of a goroutine blocked in accept per listener: the
	// shared mode's choice, where a node's pods are many and nearly all
	// quiet. An accept then costs two syscalls more (epoll_wait, the
	// re-arming epoll_ctl), batched across listeners under load.
	WatchListeners bool
	// Workers, with WatchListeners, serves the accepted connections of
	// every proxy given it from one pool of workers (the daemon makes one
	// for all pods): idle workers are as many as connections were being
	// set up at once lately, not one per pod and listener that saw a
	// connection in the last workerIdle. Nil: workers per listener.
	Workers *Workers
	// Socket options for every socket made for this workload (PACKET_MARK,
	// keepalive). Listeners additionally get SO_REUSEPORT when ReusePort.
	Socket engine.SocketOptions
	// ReusePort sets SO_REUSEPORT on the listeners (INPOD_PORT_REUSE).
	ReusePort bool
	// OrigSrc controls original-source spoofing towards the local app:
	// nil = best effort, else forced on or off (ENABLE_ORIG_SRC).
	OrigSrc *bool
	// BindHost is the listener host; "" means "[::]" (dual stack).
	BindHost string
	// Ports override the listener ports (0 = the standard ones); tests use it.
	OutboundPort, InboundPlainPort, InboundHBONEPort, SOCKS5Port int
	// SOCKS5 opens the SOCKS5 listener on 127.0.0.1 (UNSTABLE_ENABLE_SOCKS5).
	SOCKS5 bool
	// InboundOnly opens the inbound HBONE listener alone: the daemon's
	// self-proxy, which lets mesh clients reach the daemon's own ports
	// (15020 metrics) over HBONE, as ztunnel's does. It captures nothing.
	InboundOnly bool
	// DirectAppTunnel dials a workload's application tunnel (PROXY
	// protocol) at its pod address rather than over loopback
	// (LOCALHOST_APP_TUNNEL=false; the zero value is ztunnel's default).
	DirectAppTunnel bool
	// LocalWorkloadWait bounds how long a connection waits for this proxy's
	// own workload to appear in the snapshot (ztunnel: 5s).
	LocalWorkloadWait time.Duration
	// Control, when set, runs socket creation (listen and dial) in the
	// workload's network namespace.
	Control func(fn func() error) error
	// Logger receives access logs (scope "access") and errors; nil discards.
	Logger *slog.Logger
	// Metrics counts connections and bytes; nil counts nothing.
	Metrics *metrics.Metrics
	// Conns tracks authorized inbound connections so a policy change can
	// close the ones it now denies; nil tracks nothing.
	Conns *connmgr.Manager
	// CRL refuses peers with a revoked certificate in the handshake, both
	// ways, and when a reload revokes the peer of an open inbound HBONE
	// connection, closes it (crl.go); nil enforces no CRL (CRL_PATH unset).
	// The caller closes the outbound Pool's connections itself, as the
	// pool may be shared between proxies.
	CRL *mtls.CRL
	// PreferredServiceNamespace breaks ties between services sharing a VIP
	// after the client's namespace and a canonical service
	// (PREFERED_SERVICE_NAMESPACE); "" prefers none.
	PreferredServiceNamespace string
	// Resolver resolves hostname-only workloads on demand and SOCKS5 domain
	// targets that are not service hostnames; nil means net.DefaultResolver.
	Resolver Resolver
	// TLS is the daemon's TLS policy for HBONE (COMPLIANCE_POLICY); the
	// zero value is ztunnel's default.
	TLS mtls.Policy
	// PolicyInfoLogging logs policy decisions' details (the dry-run
	// outcomes) at info instead of debug (AUTHZ_POLICY_INFO_LOGGING).
	PolicyInfoLogging bool
	// OnDemand, when set (XDS_ON_DEMAND), fetches addresses the snapshot
	// lacks from the control plane before a connection is routed: the
	// outbound destination, the inbound source and a waypoint's tunnel
	// target, as ztunnel's fetch_address, fetch_workload_by_address and
	// validate_destination. Nil: the snapshot is all
	// there is.
	OnDemand Demand
	// OnDemandWait bounds each on-demand wait; zero means
	// DefaultOnDemandWait.
	OnDemandWait time.Duration
	// HandshakeTimeout bounds the TLS handshake on 15008, so a peer that
	// connects and sends nothing cannot hold a goroutine. Default 10s.
	HandshakeTimeout time.Duration
	// MaxHBONEHandshakesPerPeer bounds the TLS handshakes in progress on
	// 15008 from one source IP; connections beyond it are closed at once
	// and counted (ztunnel_go_hbone_peer_refusals_total). 0, the default,
	// is no limit, as ztunnel has none: every cross-network connection to
	// a pod arrives from its east-west gateway's one address. The
	// descriptor budget (Budget) bounds one peer's share whatever this
	// says; this is an opt-in cap on handshake work on top
	// (ZTUNNEL_HBONE_MAX_HANDSHAKES_PER_PEER).
	MaxHBONEHandshakesPerPeer int
	// MaxHBONEConnsPerPeer bounds the HBONE connections (handshaking or
	// established) on 15008 from one source IP, likewise: 0 (the default)
	// is no limit (ZTUNNEL_HBONE_MAX_CONNS_PER_PEER).
	MaxHBONEConnsPerPeer int
	// Budget is the daemon's descriptor budget, shared by every proxy:
	// each accepted connection takes its socket from it for the peer's
	// source IP, and each socket the daemon dials for a peer (15006's app,
	// an outbound passthrough's destination, an inbound CONNECT stream's
	// app) one more; over the peer's share or the total the connection is
	// reset, the stream answered 503 (budget.go). Nil is unlimited.
	Budget *fdbudget.Budget
}

// DefaultHandshakeTimeout bounds a TLS handshake on 15008.
const DefaultHandshakeTimeout = 10 * time.Second

// setDefaults fills in what cfg leaves zero (and for HandshakeTimeout,
// negative).
func (cfg *Config) setDefaults() {
	orDefault(&cfg.LocalWorkloadWait, 5*time.Second)
	orDefault(&cfg.BindHost, "::")
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	orDefault(&cfg.OutboundPort, OutboundPort)
	orDefault(&cfg.InboundPlainPort, InboundPlainPort)
	orDefault(&cfg.InboundHBONEPort, InboundHBONEPort)
	orDefault(&cfg.SOCKS5Port, SOCKS5Port)
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
}

// orDefault sets *v to def when it is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
