package app

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/dnsproxy"
	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/fdbudget"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/proxy"
	"github.com/ztunnel-go/ztunnel/state"
)

// dnsFactory builds the DNS proxy of one workload (ISTIO_META_DNS_CAPTURE).
// The upstream resolvers come from the daemon's resolv.conf, read once at
// start as ztunnel does.
type dnsFactory struct {
	cfg     *Config
	store   *state.Store
	metrics *metrics.Metrics
	log     *slog.Logger
	rc      dnsproxy.ResolvConf
	// budget is the daemon's descriptor budget, shared with the proxies.
	budget *fdbudget.Budget
	// watch, set in shared mode, serves the DNS proxies' sockets from the
	// engine's watcher (engine.Engine.WatchReadable).
	watch func(rc syscall.RawConn, ready func() time.Duration) (stop func(), err error)
	// dial makes every DNS proxy's upstream sockets (with PACKET_MARK): one
	// dialer for all, not one per pod.
	dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// newDNSFactory reads the resolv.conf. An unreadable one is logged, not
// fatal: local names are still answered and forwarded ones get SERVFAIL.
func newDNSFactory(cfg *Config, store *state.Store, m *metrics.Metrics, log *slog.Logger) *dnsFactory {
	rc, err := dnsproxy.ReadResolvConf(cfg.ResolvConf)
	if err != nil {
		log.Warn("DNS proxy has no upstream resolvers", "error", err, "scope", "dns")
	} else if len(rc.Servers) == 0 {
		log.Warn("DNS proxy has no upstream resolvers: no nameserver in "+cfg.ResolvConf, "scope", "dns")
	}
	dialer := &net.Dialer{Control: engine.SocketOptions{Mark: cfg.PacketMark}.DialControl()}
	return &dnsFactory{cfg: cfg, store: store, metrics: m, log: log, rc: rc, dial: dialer.DialContext}
}

// build returns the (unstarted) DNS proxy of w. control runs socket
// creation in the pod's namespace (shared mode); nil in dedicated mode,
// where the daemon already runs in it. Its sockets carry PACKET_MARK, so
// the pod's DNS capture does not send the forwarded queries back to it.
func (f *dnsFactory) build(w proxy.WorkloadRef, control func(fn func() error) error) (*dnsproxy.Server, error) {
	cfg := f.cfg
	var search []string
	if control == nil {
		// Dedicated mode serves the workload whose resolv.conf this is:
		// its search list is the client's (ztunnel's static search).
		search = append([]string{}, f.rc.Search...)
	}
	return dnsproxy.New(dnsproxy.Config{
		State:              f.store,
		Client:             w.Info(),
		Network:            cfg.Network,
		Domain:             cfg.ClusterDomain,
		PreferredNamespace: cfg.PreferredServiceNamespace,
		SearchDomains:      search,
		Upstreams:          f.rc.Servers,
		UpstreamTimeout:    f.rc.Timeout,
		UpstreamAttempts:   f.rc.Attempts,
		IPv4Only:           !cfg.IPv6Enabled,
		Addrs:              cfg.DNSProxyAddrs,
		Control:            control,
		ListenControl:      listenControl(cfg.PacketMark, reusePort(cfg)),
		Dial:               f.dial,
		Metrics:            f.metrics,
		Logger:             f.log,
		Budget:             f.budget,
		Watch:              f.watch,
	})
}

// onDemandResolver is the resolver of hostname-only workloads and of
// SOCKS5 names that are no service's: ztunnel asks the nameservers of the
// same resolv.conf its DNS proxy forwards to (ZTUNNEL_RESOLV_CONF here),
// read once at start, with its timeout and attempts, through one resolver
// whose answers are cached for their TTL (dnsproxy.Resolver, as ztunnel's
// hickory resolver with cache_size 4096). Without a readable one with a
// nameserver it is nil, Go's default resolver. Its sockets carry
// PACKET_MARK, as the DNS proxy's do, so a pod's DNS capture lets them
// pass. With IPV6_ENABLED=false either asks A questions only, as ztunnel's
// resolver (LookupIpStrategy::Ipv4Only).
func onDemandResolver(cfg *Config, log *slog.Logger) proxy.Resolver {
	rc, err := dnsproxy.ReadResolvConf(cfg.ResolvConf)
	if err != nil || len(rc.Servers) == 0 {
		log.Debug("on-demand DNS uses the system resolver", "resolv_conf", cfg.ResolvConf, "error", err, "scope", "dns")
		if !cfg.IPv6Enabled {
			return ipv4Resolver{net.DefaultResolver}
		}
		return nil
	}
	dialer := &net.Dialer{Control: engine.SocketOptions{Mark: cfg.PacketMark}.DialControl()}
	r, err := dnsproxy.NewResolver(dnsproxy.ResolverConfig{
		Upstreams: rc.Servers, Dial: dialer.DialContext, Timeout: rc.Timeout, Attempts: rc.Attempts,
		IPv4Only: !cfg.IPv6Enabled,
	})
	if err != nil {
		log.Debug("on-demand DNS uses the system resolver", "resolv_conf", cfg.ResolvConf, "error", err, "scope", "dns")
		return nil
	}
	return r
}

// ipv4Resolver asks its resolver for IPv4 addresses alone where the
// proxy asks for both families (network "ip"): IPV6_ENABLED=false with the
// system resolver.
type ipv4Resolver struct{ proxy.Resolver }

// LookupNetIP looks host up, for "ip4" where network is "ip".
func (r ipv4Resolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if network == "ip" {
		network = "ip4"
	}
	return r.Resolver.LookupNetIP(ctx, network, host)
}

// listenControl marks the DNS proxy's listening sockets and, with
// INPOD_PORT_REUSE in shared mode (reusePort), lets a new daemon bind the same ports during an
// upgrade (UDP and TCP alike).
func listenControl(mark uint32, reusePort bool) func(network, address string, c syscall.RawConn) error {
	markCtl := engine.SocketOptions{Mark: mark}.DialControl()
	return func(network, address string, c syscall.RawConn) error {
		if err := markCtl(network, address, c); err != nil {
			return err
		}
		if !reusePort {
			return nil
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}
}

// withDNS is a pod's proxy together with its DNS proxy, driven as one by
// the in-pod manager.
type withDNS struct {
	proxy *proxy.Proxy
	dns   *dnsproxy.Server
}

// Listen opens the proxy's listeners, then the DNS proxy's sockets, on the
// calling thread (the in-pod manager's one switch into the pod per add:
// inpod.SocketOpener); on an error both are closed, as in Start.
func (p *withDNS) Listen(ctx context.Context) error {
	if err := p.proxy.Listen(ctx); err != nil {
		p.dns.Close()
		return err
	}
	if err := p.dns.Listen(ctx); err != nil {
		p.proxy.Close()
		p.dns.Close()
		return err
	}
	return nil
}

// Start starts the proxy, then the DNS proxy (each opens its sockets unless
// Listen has); if the latter fails the pod is not up, and both are closed
// so the manager's retry starts afresh.
func (p *withDNS) Start(ctx context.Context) error {
	if err := p.proxy.Start(ctx); err != nil {
		p.dns.Close()
		return err
	}
	if err := p.dns.Start(ctx); err != nil {
		p.proxy.Close()
		p.dns.Close()
		return err
	}
	return nil
}

// Drain drains both at once.
func (p *withDNS) Drain(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { p.dns.Drain(ctx) })
	p.proxy.Drain(ctx)
	wg.Wait()
}

// Close closes both.
// Connections are the proxy's open connections (the DNS proxy has none
// that the dump shows).
func (p *withDNS) Connections() []proxy.Connection { return p.proxy.Connections() }

func (p *withDNS) Close() {
	p.proxy.Close()
	p.dns.Close()
}
