package caclient_test

import (
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/caclient/catest"
)

func held(store *mtls.Store) map[identity.Identity]bool {
	out := map[identity.Identity]bool{}
	for _, c := range store.Certificates() {
		out[c.Identity] = true
	}
	return out
}

func waitHeld(t *testing.T, store *mtls.Store, want ...identity.Identity) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		h := held(store)
		ok := len(h) == len(want)
		for _, id := range want {
			ok = ok && h[id]
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("store holds %v, want %v", h, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPrefetcher(t *testing.T) {
	srv := catest.NewServer(t, catest.Options{})
	store := mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: newIstioCA(t, srv, nil), Impersonate: true})})
	defer store.Close()
	p := caclient.NewPrefetcher(store, t.Logf)
	defer p.Close()

	var ids []identity.Identity
	for _, sa := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		ids = append(ids, identity.New("cluster.local", "ns", sa))
	}
	// Ten identities arrive on the node: all are fetched without any Get.
	p.Sync(ids)
	waitHeld(t, store, ids...)
	if n := len(srv.Requests()); n != len(ids) {
		t.Errorf("%d CA requests, want one per identity", n)
	}
	// The same set again fetches nothing.
	p.Sync(ids)
	// Identities that left the node are forgotten; a new one is fetched.
	k := identity.New("cluster.local", "ns", "k")
	p.Sync([]identity.Identity{ids[0], k})
	waitHeld(t, store, ids[0], k)
	if n := len(srv.Requests()); n != len(ids)+1 {
		t.Errorf("%d CA requests, want %d", n, len(ids)+1)
	}
	p.Close()
	p.Sync(ids) // after Close: ignored
}
