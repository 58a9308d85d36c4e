package proxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/ztunnel-go/ztunnel/proxy/socks5"
	"github.com/ztunnel-go/ztunnel/state"
)

// Names to addresses, for the router: a hostname-only workload's address
// (selectIP, on a route's way) and a SOCKS5 client's named destination
// (resolveSOCKS, before routing).

// Resolver looks up the addresses of hostname-only workloads (ztunnel's
// on-demand DNS). *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// dnsTimeout bounds one on-demand lookup of a workload hostname.
const dnsTimeout = 10 * time.Second

// selectIP picks the address to dial w on: state.SelectAddress, or for a
// hostname-only workload an on-demand DNS lookup, preferring want's family.
func (rt *router) selectIP(ctx context.Context, src, w *state.Workload, want netip.Addr, fam state.IPFamilies) (netip.Addr, error) {
	if ip, ok := state.SelectAddress(w, want, fam); ok {
		return ip, nil
	}
	if w.Hostname() == "" {
		return netip.Addr{}, fmt.Errorf("workload %s has no suitable address", w.UID)
	}
	rt.metrics.OnDemandDNS(metricsWorkload(src, rt.identityOf(src)), w.Hostname())
	ctx, cancel := context.WithTimeout(ctx, dnsTimeout)
	defer cancel()
	addrs, err := rt.resolver.LookupNetIP(ctx, "ip", w.Hostname())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("workload %s: dns lookup of %s: %w", w.UID, w.Hostname(), err)
	}
	ip, ok := pickResolved(addrs, want, rt.rnd)
	if !ok {
		return netip.Addr{}, fmt.Errorf("workload %s: dns lookup of %s returned no address", w.UID, w.Hostname())
	}
	return ip, nil
}

// pickResolved picks one of a lookup's addresses at random, from those of
// want's family if there are any (pure IPv4 or IPv6 clients need their own
// family), else from all.
func pickResolved(addrs []netip.Addr, want netip.Addr, rnd func(uint64) uint64) (netip.Addr, bool) {
	if rnd == nil {
		rnd = rand.Uint64N
	}
	want = want.Unmap()
	var same int
	for _, a := range addrs {
		if a.Unmap().Is6() == want.Is6() {
			same++
		}
	}
	if same == 0 {
		if len(addrs) == 0 {
			return netip.Addr{}, false
		}
		return addrs[rnd(uint64(len(addrs)))].Unmap(), true
	}
	n := rnd(uint64(same))
	for _, a := range addrs {
		if a.Unmap().Is6() == want.Is6() {
			if n == 0 {
				return a.Unmap(), true
			}
			n--
		}
	}
	return netip.Addr{}, false
}

// resolveSOCKS turns a SOCKS5 target into an address. A service hostname
// resolves to the service's VIP on our network (what the DNS proxy would
// answer); any other name goes to the resolver.
func (rt *router) resolveSOCKS(ctx context.Context, t socks5.Target) (netip.AddrPort, error) {
	if !t.IsDomain() {
		return t.Addr, nil
	}
	snap := rt.state.Load()
	clientNS := rt.self.Namespace
	if ip, ok := serviceVIP(snap, rt.network, t.Host, clientNS); ok {
		return netip.AddrPortFrom(ip, t.Port), nil
	}
	ips, err := rt.resolver.LookupNetIP(ctx, "ip", t.Host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("resolve %s: %w", t.Host, err)
	}
	// Prefer IPv4, as most pods have it; else the first answer.
	best := ips[0]
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			best = ip
			break
		}
	}
	return netip.AddrPortFrom(best.Unmap(), t.Port), nil
}

// serviceVIP finds the VIP of the service named host that a client in
// clientNS may use: one in the client's namespace first, then the first
// visible one by key; an IPv4 VIP on network first, then an IPv6 one.
func serviceVIP(snap *state.Snapshot, network, host, clientNS string) (netip.Addr, bool) {
	var chosen *state.Service
	for _, svc := range snap.ServicesByHostname(host) {
		if !svc.VisibleTo(clientNS) {
			continue
		}
		if chosen == nil || (svc.Namespace == clientNS && chosen.Namespace != clientNS) {
			chosen = svc
		}
	}
	if chosen == nil {
		return netip.Addr{}, false
	}
	var v6 netip.Addr
	for _, vip := range chosen.VIPs {
		if vip.Network != network {
			continue
		}
		if vip.Addr.Is4() {
			return vip.Addr, true
		}
		if !v6.IsValid() {
			v6 = vip.Addr
		}
	}
	return v6, v6.IsValid()
}
