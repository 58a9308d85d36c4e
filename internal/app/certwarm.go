package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/inpod"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/proxy"
	"github.com/ztunnel-go/ztunnel/state"
)

// certWarmer keeps the certificates of the identities served on this node
// warm and forgets the others, as ztunnel's certificate prefetch does in
// shared mode: an identity is fetched when the first workload with it on
// this node (NODE_NAME, and CLUSTER_ID when the workload says) appears,
// whether from xDS or as a pod handed over by ZDS, and forgotten when the
// last one leaves. Workloads of other nodes are never prefetched: their
// identities are only ever needed by their own node's proxy.
type certWarmer struct {
	pf            *caclient.Prefetcher
	node, cluster string
	trustDomain   string
	mu            sync.Mutex                // guards the following fields
	pods          map[identity.Identity]int // pods up, by identity
	fromState     map[identity.Identity]bool
	closed        bool

	// Owned by the goroutine that calls snapshot: the last snapshot
	// taken (the store's current one but for a debounce's while, so that
	// holding it costs no memory of note), the number of the node's served
	// workloads in it by identity (kept up to date from the workloads each
	// new snapshot changes, not by a scan: issue 36), and how many
	// workloads the diffs visited, for the tests.
	last    *state.Snapshot
	byID    map[identity.Identity]int
	visited int
}

// newCertWarmer returns a warmer filling certs. In dedicated mode it scans
// no snapshot (the one proxy serves one identity, counted when it starts),
// as ztunnel prefetches other workloads' certificates in shared mode only.
func newCertWarmer(certs *mtls.Store, cfg *Config, log *slog.Logger) *certWarmer {
	c := &certWarmer{
		pf: caclient.NewPrefetcher(certs, func(f string, a ...any) {
			log.Error(fmt.Sprintf(f, a...), "scope", "identity")
		}),
		cluster: cfg.ClusterID, trustDomain: cfg.TrustDomain,
		pods: map[identity.Identity]int{}, fromState: map[identity.Identity]bool{},
		byID: map[identity.Identity]int{},
	}
	if cfg.Mode == ModeShared {
		c.node = cfg.NodeName
	}
	return c
}

// wrap makes p count the identity of the workload (namespace, service
// account) in the warmer while it is up.
func (c *certWarmer) wrap(p inpod.Proxy, namespace, serviceAccount string) inpod.Proxy {
	return &warmedProxy{Proxy: p, w: c, id: identity.New(c.trustDomain, namespace, serviceAccount)}
}

// warmDebounce is how long the warmer lets pushes accumulate before it
// takes the newest snapshot: pushes come in bursts (one per xDS response),
// so a burst costs one diff and one Sync of the prefetcher, not one per
// snapshot.
const warmDebounce = 100 * time.Millisecond

// run follows the published snapshots until ctx ends.
func (c *certWarmer) run(ctx context.Context, store *state.Store) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		changed := store.Changed()
		c.snapshot(store.Load())
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
		t.Reset(warmDebounce)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// snapshot takes the node's identities from snap: its HBONE (or native
// tunnel) workloads on this node; a workload that takes plain TCP needs no
// certificate of ours. It visits only the workloads snap changed since the
// last snapshot taken (state.Snapshot.DiffWorkloads), which costs what the
// pushes in between changed: a scan of every workload came to ~10 full
// scans a second at 100,000 workloads under 100 changes/s (issue 36).
func (c *certWarmer) snapshot(snap *state.Snapshot) {
	if c.node != "" {
		snap.DiffWorkloads(c.last, func(old, cur *state.Workload) {
			c.visited++
			if old != nil && c.serves(old) {
				id := old.Identity()
				if c.byID[id]--; c.byID[id] <= 0 {
					delete(c.byID, id)
				}
			}
			if cur != nil && c.serves(cur) {
				c.byID[cur.Identity()]++
			}
		})
		c.last = snap
	}
	ids := make(map[identity.Identity]bool, len(c.byID))
	for id := range c.byID {
		ids[id] = true
	}
	c.mu.Lock()
	c.fromState = ids
	c.syncLocked()
	c.mu.Unlock()
}

// serves reports whether w is a workload of this node whose certificate
// the node's proxy needs.
func (c *certWarmer) serves(w *state.Workload) bool {
	if w.Node() != c.node || (c.cluster != "" && w.ClusterID() != "" && w.ClusterID() != c.cluster) {
		return false
	}
	return w.Protocol == state.ProtocolHBONE || w.NativeTunnel
}

// podUp counts a pod whose proxy serves id; podDown undoes it.
func (c *certWarmer) podUp(id identity.Identity) {
	c.mu.Lock()
	c.pods[id]++
	c.syncLocked()
	c.mu.Unlock()
}

func (c *certWarmer) podDown(id identity.Identity) {
	c.mu.Lock()
	if c.pods[id]--; c.pods[id] <= 0 {
		delete(c.pods, id)
	}
	c.syncLocked()
	c.mu.Unlock()
}

// syncLocked hands the union of both sources to the prefetcher, which
// fetches what is new and forgets what is gone.
func (c *certWarmer) syncLocked() {
	if c.closed {
		return
	}
	ids := make([]identity.Identity, 0, len(c.fromState)+len(c.pods))
	for id := range c.fromState {
		ids = append(ids, id)
	}
	for id := range c.pods {
		if !c.fromState[id] {
			ids = append(ids, id)
		}
	}
	c.pf.Sync(ids)
}

// close stops prefetching (certificates already fetched stay).
func (c *certWarmer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.pf.Close()
}

// warmedProxy is a pod's proxy that counts its identity in the warmer
// while it is up.
type warmedProxy struct {
	inpod.Proxy
	w    *certWarmer
	id   identity.Identity
	once sync.Once
	up   bool
}

// Listen opens the wrapped proxy's sockets when it can open them apart
// from Start (inpod.SocketOpener); else Start opens them.
func (p *warmedProxy) Listen(ctx context.Context) error {
	if o, ok := p.Proxy.(inpod.SocketOpener); ok {
		return o.Listen(ctx)
	}
	return nil
}

// Start starts the proxy; once it is up, its identity counts.
func (p *warmedProxy) Start(ctx context.Context) error {
	if err := p.Proxy.Start(ctx); err != nil {
		return err
	}
	p.up = true
	p.w.podUp(p.id)
	return nil
}

// Drain drains the proxy, then its identity no longer counts.
func (p *warmedProxy) Drain(ctx context.Context) {
	p.Proxy.Drain(ctx)
	p.down()
}

// Close closes the proxy, then its identity no longer counts.
// Connections are the wrapped proxy's open connections, for the dump's
// workloadState (nil when it lists none).
func (p *warmedProxy) Connections() []proxy.Connection {
	if c, ok := p.Proxy.(interface{ Connections() []proxy.Connection }); ok {
		return c.Connections()
	}
	return nil
}

func (p *warmedProxy) Close() {
	p.Proxy.Close()
	p.down()
}

func (p *warmedProxy) down() {
	p.once.Do(func() {
		if p.up {
			p.w.podDown(p.id)
		}
	})
}
