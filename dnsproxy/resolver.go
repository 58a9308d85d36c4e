package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Resolver looks up the addresses of a hostname through the upstream
// resolvers, with the same answer cache as the DNS proxy's forwarder: the
// daemon's on-demand resolution of hostname-only workloads and SOCKS5
// names, as ztunnel's resolver (hickory's, cache_size 4096) serves both.
// One per daemon; its sockets are made by Config's Dial (the daemon's own
// namespace, with its mark).
type Resolver struct {
	fw       *forwarder
	ipv4Only bool // ResolverConfig.IPv4Only
}

// ResolverConfig configures a Resolver.
type ResolverConfig struct {
	// Upstreams are the resolvers, "host:port", tried as the DNS proxy
	// tries them. Required.
	Upstreams []string
	// Dial makes the sockets; nil uses a plain net.Dialer.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Timeout bounds one exchange with one upstream (resolv.conf's
	// timeout); 0 means 5 s.
	Timeout time.Duration
	// Attempts is the rounds through the upstreams (resolv.conf's
	// attempts); 0 means 2.
	Attempts int
	// CacheSize is how many answers are kept for their TTL; 0 means
	// DefaultCacheSize, negative turns the cache off.
	CacheSize int
	// IPv4Only is IPV6_ENABLED=false: a lookup for network "ip" asks A
	// only, as ztunnel's resolver then does (LookupIpStrategy::Ipv4Only).
	IPv4Only bool
}

// NewResolver returns a Resolver for cfg.
func NewResolver(cfg ResolverConfig) (*Resolver, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, ErrNoUpstream
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 2
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	return &Resolver{fw: newForwarder(cfg.Upstreams, cfg.Dial, nil, cfg.Timeout, cfg.Attempts, cfg.CacheSize), ipv4Only: cfg.IPv4Only}, nil
}

// LookupNetIP returns host's addresses: its A records for network "ip4",
// AAAA for "ip6", both (asked at once) for "ip" (A alone with
// ResolverConfig.IPv4Only). host is taken as a fully
// qualified name; CNAMEs are followed by the upstream, whose answer holds
// the chain's addresses. A name that does not exist, or has no address of
// the family asked, is a *net.DNSError with IsNotFound.
func (r *Resolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	var types []uint16
	switch network {
	case "ip":
		types = []uint16{dns.TypeA, dns.TypeAAAA}
		if r.ipv4Only {
			types = types[:1]
		}
	case "ip4":
		types = []uint16{dns.TypeA}
	case "ip6":
		types = []uint16{dns.TypeAAAA}
	default:
		return nil, fmt.Errorf("dnsproxy: lookup %s: unknown network %q", host, network)
	}
	if _, ok := dns.IsDomainName(host); !ok {
		return nil, &net.DNSError{Err: "invalid domain name", Name: host}
	}
	name := dns.Fqdn(host)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		addrs []netip.Addr
		errs  []error
	)
	for _, qt := range types {
		wg.Go(func() {
			req := new(dns.Msg)
			req.SetQuestion(name, qt)
			resp, err := r.fw.lookup(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if resp.Rcode != dns.RcodeSuccess && resp.Rcode != dns.RcodeNameError {
				errs = append(errs, fmt.Errorf("%s %s: %s", name, dns.TypeToString[qt], dns.RcodeToString[resp.Rcode]))
				return
			}
			for _, rr := range resp.Answer {
				switch rr := rr.(type) {
				case *dns.A:
					if a, ok := netip.AddrFromSlice(rr.A.To4()); ok {
						addrs = append(addrs, a)
					}
				case *dns.AAAA:
					if a, ok := netip.AddrFromSlice(rr.AAAA); ok {
						addrs = append(addrs, a)
					}
				}
			}
		})
	}
	wg.Wait()
	if len(addrs) > 0 {
		return addrs, nil
	}
	if len(errs) > 0 {
		return nil, &net.DNSError{Err: errors.Join(errs...).Error(), Name: host, IsTemporary: true}
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}
