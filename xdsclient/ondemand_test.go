package xdsclient_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel/xdsclient"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

func TestOnDemand(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Set(typeA, "10.0.0.1", "v1", str("pod-1"))
	srv.Set(typeA, "10.0.0.2", "v1", str("pod-2"))
	srv.Set(typeB, "b1", "v1", wrapperspb.UInt32(1))
	r := newRig(t, srv, func(c *xdsclient.Config) { c.OnDemandTypes = []string{typeA} }).start(t)

	first := srv.WaitRequest(func(q *xdstest.Request) bool { return q.TypeUrl == typeA })
	if !slices.Equal(first.ResourceNamesSubscribe, []string{"*"}) || !slices.Equal(first.ResourceNamesUnsubscribe, []string{"*"}) {
		t.Errorf("on-demand initial request subscribes %v, unsubscribes %v; want * and *", first.ResourceNamesSubscribe, first.ResourceNamesUnsubscribe)
	}
	// Synced waits only for B.
	r.waitSynced(t)
	if got := r.a.snapshot(); len(got) != 0 {
		t.Errorf("on-demand type holds %v before any lookup", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := r.client.Lookup(ctx, typeA, "10.0.0.1"); err != nil {
		t.Fatal(err)
	}
	// Lookup returns after the handler ran.
	if got := r.a.snapshot(); !maps.Equal(got, map[string]string{"10.0.0.1": "pod-1"}) {
		t.Errorf("after lookup holds %v", got)
	}
	sub := srv.WaitRequest(func(q *xdstest.Request) bool { return q.TypeUrl == typeA && len(q.ResourceNamesSubscribe) > 0 })
	if !slices.Equal(sub.ResourceNamesSubscribe, []string{"10.0.0.1"}) || sub.Node != nil {
		t.Errorf("lookup request %v", sub)
	}
	// A name the server does not have comes back as a removal.
	if err := r.client.Lookup(ctx, typeA, "10.9.9.9"); err != nil {
		t.Fatal(err)
	}
	// Subscribed names are pushed on change.
	srv.Set(typeA, "10.0.0.1", "v2", str("pod-1b"))
	r.a.waitUpdate(t)
	for r.a.snapshot()["10.0.0.1"] != "pod-1b" {
		r.a.waitUpdate(t)
	}
	srv.Set(typeA, "10.0.0.2", "v2", str("never sent"))

	// A restart resumes the names looked up.
	srv.Restart()
	req := srv.WaitRequest(func(q *xdstest.Request) bool { return q.Stream == 2 && q.TypeUrl == typeA })
	if want := map[string]string{"10.0.0.1": "v2"}; !maps.Equal(req.InitialResourceVersions, want) {
		t.Errorf("resumed initial_resource_versions %v, want %v", req.InitialResourceVersions, want)
	}
	if got := r.a.snapshot()["10.0.0.2"]; got != "" {
		t.Errorf("unrequested resource pushed: %q", got)
	}

	if err := r.client.Lookup(ctx, typeB, "b1"); !errors.Is(err, xdsclient.ErrNotOnDemand) {
		t.Errorf("Lookup on a wildcard type: %v, want ErrNotOnDemand", err)
	}
	short, cancelShort := context.WithCancel(ctx)
	cancelShort()
	if err := r.client.Lookup(short, typeA, "x"); !errors.Is(err, context.Canceled) {
		t.Errorf("Lookup with a done context: %v", err)
	}
}

// TestOnDemandByAlias: istiod answers a lookup of "network/IP" with the
// workload under its own name (its uid) and the asked-for name among its
// aliases; the lookup must end when that answer has been applied.
func TestOnDemandByAlias(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	res := xdstest.NewResource(t, "Kubernetes//Pod/ns/pod-1", "v1", str("pod-1"))
	res.Aliases = []string{"net1/10.0.0.1"}
	srv.Update(typeA, []*discoveryv3.Resource{res}, nil)
	srv.Set(typeB, "b1", "v1", wrapperspb.UInt32(1))
	r := newRig(t, srv, func(c *xdsclient.Config) { c.OnDemandTypes = []string{typeA} }).start(t)
	r.waitSynced(t)

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := r.client.Lookup(ctx, typeA, "net1/10.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if got := r.a.snapshot(); !maps.Equal(got, map[string]string{"Kubernetes//Pod/ns/pod-1": "pod-1"}) {
		t.Errorf("after the lookup by alias the handler holds %v", got)
	}
}
