package caclient_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// countingSigner counts the signing requests that reach a built-in CA: the
// prefetcher's test needs to know how many certificates were asked for, not
// how they travel (the Istio CA's gRPC path has tests of its own).
type countingSigner struct {
	ca       *caclient.BuiltinCA
	requests atomic.Int32
}

func (c *countingSigner) Sign(ctx context.Context, csrPEM []byte, ttl time.Duration, imp identity.Identity) ([]string, error) {
	c.requests.Add(1)
	return c.ca.Sign(ctx, csrPEM, ttl, imp)
}

func held(store *mtls.Store) map[identity.Identity]bool {
	out := map[identity.Identity]bool{}
	for _, c := range store.Certificates() {
		out[c.Identity] = true
	}
	return out
}

// checkHeld waits for the bubble's fetches to finish and checks that the
// store holds exactly want.
func checkHeld(t *testing.T, store *mtls.Store, want ...identity.Identity) {
	t.Helper()
	synctest.Wait()
	h := held(store)
	ok := len(h) == len(want)
	for _, id := range want {
		ok = ok && h[id]
	}
	if !ok {
		t.Fatalf("store holds %v, want %v", h, want)
	}
}

// TestPrefetcher runs in a synctest bubble: when every fetch the prefetcher
// started is done is known exactly (synctest.Wait), not polled for.
func TestPrefetcher(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := &countingSigner{ca: tlstest.NewCA(t, "cluster.local")}
		store := mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: ca, Impersonate: true})})
		defer store.Close()
		p := caclient.NewPrefetcher(store, t.Logf)
		defer p.Close()

		var ids []identity.Identity
		for _, sa := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
			ids = append(ids, identity.New("cluster.local", "ns", sa))
		}
		// Ten identities arrive on the node: all are fetched without any Get.
		p.Sync(ids)
		checkHeld(t, store, ids...)
		if n := ca.requests.Load(); n != int32(len(ids)) {
			t.Errorf("%d CA requests, want one per identity", n)
		}
		// The same set again fetches nothing.
		p.Sync(ids)
		// Identities that left the node are forgotten; a new one is fetched.
		k := identity.New("cluster.local", "ns", "k")
		p.Sync([]identity.Identity{ids[0], k})
		checkHeld(t, store, ids[0], k)
		if n := ca.requests.Load(); n != int32(len(ids)+1) {
			t.Errorf("%d CA requests, want %d", n, len(ids)+1)
		}
		p.Close()
		p.Sync(ids) // after Close: ignored
	})
}
