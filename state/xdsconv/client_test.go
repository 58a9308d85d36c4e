package xdsconv

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/xdsclient"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// runClient runs an xDS client feeding a fresh XDSState from srv until the
// test ends.
func runClient(t *testing.T, srv *xdstest.Server, onDemand bool) (*xdsclient.Client, *state.Store) {
	t.Helper()
	x, store := newState(t, nil)
	cfg := xdsclient.Config{Address: srv.Address(), RootCA: srv.TLS().RootFile, Logf: func(l slog.Level, f string, a ...any) { t.Logf(l.String()+" "+f, a...) }}
	if onDemand {
		cfg.OnDemandTypes = []string{AddressType}
	}
	c := xdsclient.New(cfg)
	x.Register(c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-c.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("not synced")
	}
	return c, store
}

func TestThroughXDSClient(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	const key = "ns/web.ns.svc.cluster.local"
	srv.Set(AddressType, "w1", "1", wlAddr("w1", "10.0.0.1", withServices(key)))
	srv.Set(AddressType, key, "1", svcAddr("web", "10.96.0.1"))
	srv.Set(AuthorizationType, "ns/deny", "1", &securityapi.Authorization{
		Name: "deny", Namespace: "ns", Scope: securityapi.Scope_NAMESPACE, Action: securityapi.Action_DENY,
	})
	_, store := runClient(t, srv, false)

	s := store.Load()
	if w := s.WorkloadByAddr("", netip.MustParseAddr("10.0.0.1")); w == nil || w.UID != "w1" {
		t.Fatalf("w1 not applied: %v", w)
	}
	if got := endpointUIDs(s, key); len(got) != 1 || len(s.Policies()) != 1 {
		t.Fatalf("endpoints %v, policies %d", got, len(s.Policies()))
	}

	// A push with a bad workload: it is NACKed by name, the others applied.
	ch := store.Changed()
	srv.Update(AddressType, []*discoveryv3.Resource{
		xdstest.NewResource(t, "w2", "1", wlAddr("w2", "10.0.0.2")),
		xdstest.NewResource(t, "legacy", "1", wlAddr("legacy", "10.0.0.3", func(w *workloadapi.Workload) {
			w.TunnelProtocol = workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS
		})),
	}, nil)
	nack := srv.WaitRequest(func(r *xdstest.Request) bool { return r.TypeUrl == AddressType && r.IsNack() })
	if want := "legacy: " + ErrLegacyIstioMTLS.Error(); nack.ErrorDetail.GetMessage() != want {
		t.Errorf("error_detail %q, want %q", nack.ErrorDetail.GetMessage(), want)
	}
	<-ch
	s = store.Load()
	if s.WorkloadByUID("w2") == nil || s.WorkloadByUID("legacy") != nil {
		t.Errorf("after the partial push: w2 %v, legacy %v", s.WorkloadByUID("w2"), s.WorkloadByUID("legacy"))
	}
}

func TestOnDemandLookup(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	// istiod answers an on-demand "network/IP" request with the resource
	// under that name.
	srv.Set(AddressType, "/10.0.0.5", "1", wlAddr("Kubernetes//Pod/ns/p5", "10.0.0.5"))
	c, store := runClient(t, srv, true)
	ip := netip.MustParseAddr("10.0.0.5")
	if store.Load().WorkloadByAddr("", ip) != nil {
		t.Fatal("on-demand workload present before the lookup")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Lookup(ctx, AddressType, "/10.0.0.5"); err != nil {
		t.Fatal(err)
	}
	if w := store.Load().WorkloadByAddr("", ip); w == nil || w.UID != "Kubernetes//Pod/ns/p5" {
		t.Errorf("after lookup: %v", w)
	}
	if err := c.Lookup(ctx, AuthorizationType, "ns/x"); !errors.Is(err, xdsclient.ErrNotOnDemand) {
		t.Errorf("lookup of a policy: %v", err)
	}
}
