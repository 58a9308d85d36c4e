package proxy

import (
	"context"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
	"github.com/ztunnel-go/ztunnel/state"
)

// The router's tests call it as the handlers do, built by newRouter from a
// Config with what each test exercises, with no proxy or listener (its
// decisions: route_test.go, gateway_test.go, localworkload_test.go; these
// are the identities, the SOCKS5 names and the on-demand wait).

// A record that names no trust domain takes the proxy's; one that names
// its own keeps it.
func TestRouterIdentityOf(t *testing.T) {
	rt := newRouter(&Config{TrustDomain: "example.org"})
	w := &state.Workload{Labels: &state.WorkloadLabels{Namespace: "ns", ServiceAccount: "sa"}}
	if got, want := rt.identityOf(w), identity.New("example.org", "ns", "sa"); got != want {
		t.Errorf("record without trust domain: %v, want %v", got, want)
	}
	w.EditLabels().TrustDomain = "other.org"
	if got, want := rt.identityOf(w), identity.New("other.org", "ns", "sa"); got != want {
		t.Errorf("record with its own trust domain: %v, want %v", got, want)
	}
}

// ownIdentity hands every connection of one workload record the same
// identity; a new record (a push) gets its own.
func TestRouterOwnIdentity(t *testing.T) {
	rt := newRouter(&Config{TrustDomain: "cluster.local"})
	w1 := &state.Workload{Labels: &state.WorkloadLabels{Namespace: "ns", ServiceAccount: "a"}}
	id1 := rt.ownIdentity(w1)
	if rt.ownIdentity(w1) != id1 {
		t.Error("the same record got a second identity")
	}
	if *id1 != rt.identityOf(w1) {
		t.Errorf("ownIdentity %v, want identityOf's %v", *id1, rt.identityOf(w1))
	}
	w2 := &state.Workload{Labels: &state.WorkloadLabels{Namespace: "ns", ServiceAccount: "b"}}
	if id2 := rt.ownIdentity(w2); id2 == id1 || *id2 != rt.identityOf(w2) {
		t.Errorf("after a new record: %v (shared %v), want %v of its own", *id2, id2 == id1, rt.identityOf(w2))
	}
}

// A SOCKS5 name that is a service hostname the client may see is its VIP
// (IPv4 first); any other name goes to the resolver (IPv4 first); an
// address is taken as given.
func TestRouterResolveSOCKS(t *testing.T) {
	snap := routeMesh(t) // route_test.go
	res := &fakeResolver{answers: map[string][]netip.Addr{
		"vm.example.com": {netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("198.51.100.7")},
	}}
	rt := newRouter(&Config{Workload: WorkloadRef{Namespace: "app", Name: "client"}, State: state.NewStore(snap), Resolver: res})
	tests := []struct {
		name   string
		target socks5.Target
		want   string
		asked  bool
	}{
		{"address", socks5.Target{Addr: netip.MustParseAddrPort("10.0.0.10:80"), Port: 80}, "10.0.0.10:80", false},
		{"dual-stack service", socks5.Target{Host: "web.app.svc", Port: 80}, "10.96.0.10:80", false},
		{"IPv6-only service", socks5.Target{Host: "v4.app.svc", Port: 81}, "[fd96::60]:81", false},
		{"other name", socks5.Target{Host: "vm.example.com", Port: 443}, "198.51.100.7:443", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res.asked = nil
			got, err := rt.resolveSOCKS(context.Background(), tc.target)
			if err != nil || got.String() != tc.want {
				t.Fatalf("resolveSOCKS(%+v) = %v, %v; want %s", tc.target, got, err, tc.want)
			}
			if asked := len(res.asked) > 0; asked != tc.asked {
				t.Errorf("resolver asked %v, want asked=%v", res.asked, tc.asked)
			}
		})
	}
	// A service outside the client's view is not its VIP: the name goes
	// to the resolver, which does not know it.
	if got, err := rt.resolveSOCKS(context.Background(), socks5.Target{Host: "private.secret.svc", Port: 80}); err == nil {
		t.Errorf("namespace-private service resolved to %v for a client in another namespace", got)
	}
}

// fetchAddress asks for "network/IP" only when the snapshot lacks the
// address, waits for the answer at most OnDemandWait (DefaultOnDemandWait
// when zero), and returns the store's snapshot after it, answered or not.
func TestRouterFetchAddressWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait time.Duration
		want time.Duration
	}{
		{"configured", 50 * time.Millisecond, 50 * time.Millisecond},
		{"default", 0, DefaultOnDemandWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				before := routeMesh(t) // route_test.go
				store := state.NewStore(before)
				var asked []string
				rt := newRouter(&Config{Network: "net1", State: store, OnDemandWait: tc.wait,
					OnDemand: func(ctx context.Context, name string) error {
						asked = append(asked, name)
						<-ctx.Done() // a control plane that never answers
						return ctx.Err()
					}})
				addr := netip.MustParseAddr("::ffff:10.1.2.3")
				if got := rt.fetchAddress(context.Background(), before, addr, func(*state.Snapshot) bool { return true }); got != before || asked != nil {
					t.Fatalf("known address: snapshot %p (want %p), asked %v", got, before, asked)
				}
				after := routeMesh(t)
				store.Publish(after)
				start := time.Now()
				got := rt.fetchAddress(context.Background(), before, addr, func(*state.Snapshot) bool { return false })
				if waited := time.Since(start); waited != tc.want {
					t.Errorf("waited %v, want %v", waited, tc.want)
				}
				if got != after {
					t.Error("after the wait: not the store's current snapshot")
				}
				if len(asked) != 1 || asked[0] != "net1/10.1.2.3" {
					t.Errorf("asked %v, want [net1/10.1.2.3]", asked)
				}
			})
		})
	}
}
