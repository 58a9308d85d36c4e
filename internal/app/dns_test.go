package app

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
)

// networkRecorder is a proxy.Resolver that records the networks asked.
type networkRecorder struct{ asked []string }

func (r *networkRecorder) LookupNetIP(_ context.Context, network, _ string) ([]netip.Addr, error) {
	r.asked = append(r.asked, network)
	return nil, nil
}

// TestOnDemandResolverIPv4Only: with IPV6_ENABLED=false and no resolv.conf
// to read, the on-demand lookups through the system resolver still ask for
// IPv4 alone, as ztunnel's resolver then does (LookupIpStrategy::Ipv4Only);
// with IPv6 enabled the proxy's default (nil) is kept.
func TestOnDemandResolverIPv4Only(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	missing := filepath.Join(t.TempDir(), "resolv.conf")
	if r := onDemandResolver(&Config{ResolvConf: missing, Compat: Compat{IPv6Enabled: true}}, log); r != nil {
		t.Fatalf("IPv6 enabled: %T, want nil (the system resolver)", r)
	}
	r := onDemandResolver(&Config{ResolvConf: missing}, log)
	v4, ok := r.(ipv4Resolver)
	if !ok {
		t.Fatalf("IPv6 disabled: %T, want ipv4Resolver", r)
	}
	rec := &networkRecorder{}
	v4.Resolver = rec
	for _, network := range []string{"ip", "ip4", "ip6"} {
		v4.LookupNetIP(context.Background(), network, "example.com")
	}
	if want := []string{"ip4", "ip4", "ip6"}; !slices.Equal(rec.asked, want) {
		t.Fatalf("asked %v, want %v", rec.asked, want)
	}
}
