package caclient

import (
	"context"
	"slices"
	"sync"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// maxPrefetches is how many prefetches run at once (ztunnel allows 8
// concurrent CSRs). Connections that need a certificate never queue behind
// them: their Store.Get starts (or joins) a fetch at once.
const maxPrefetches = 8

// Prefetcher keeps the certificates of the identities on this node warm, as
// ztunnel does in shared mode: an identity that appears among the node's
// workloads is fetched in the background before its first connection asks,
// and forgotten (its refreshes stopped) when the last workload with it
// leaves the node. Prefetches yield to connections: at most maxPrefetches run
// at once, while Store.Get never waits for them.
//
// A Prefetcher is safe for concurrent use. Close it to stop its goroutines.
type Prefetcher struct {
	store  *mtls.Store
	logf   func(string, ...any)
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the workers

	mu sync.Mutex // guards the following fields
	// held is the set last passed to Sync.
	held    map[identity.Identity]bool
	queue   []identity.Identity // held identities not yet prefetched
	running int                 // workers alive
	closed  bool
}

// NewPrefetcher returns a Prefetcher filling store. logf (nil: discard)
// receives prefetch failures; the identity is fetched again when a
// connection needs it.
func NewPrefetcher(store *mtls.Store, logf func(string, ...any)) *Prefetcher {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	p := &Prefetcher{store: store, logf: logf, held: map[identity.Identity]bool{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// Sync sets the identities on the node: new ones are prefetched, and those
// of the previous Sync that are gone are forgotten by the store. The daemon
// calls it with the identities of the node's HBONE (or native tunnel)
// workloads after every snapshot.
func (p *Prefetcher) Sync(ids []identity.Identity) {
	want := make(map[identity.Identity]bool, len(ids))
	for _, id := range ids {
		if !id.IsZero() {
			want[id] = true
		}
	}
	var gone []identity.Identity
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	for id := range p.held {
		if !want[id] {
			delete(p.held, id)
			gone = append(gone, id)
		}
	}
	for id := range want {
		if !p.held[id] {
			p.held[id] = true
			p.queue = append(p.queue, id)
		}
	}
	p.queue = slices.DeleteFunc(p.queue, func(id identity.Identity) bool { return !p.held[id] })
	for p.running < maxPrefetches && p.running < len(p.queue) {
		p.running++
		p.wg.Go(p.work)
	}
	p.mu.Unlock()
	for _, id := range gone {
		p.store.Forget(id)
	}
}

// work prefetches queued identities until the queue is empty.
func (p *Prefetcher) work() {
	for {
		p.mu.Lock()
		if len(p.queue) == 0 || p.closed {
			p.running--
			p.mu.Unlock()
			return
		}
		id := p.queue[0]
		p.queue = p.queue[1:]
		p.mu.Unlock()
		if _, err := p.store.Get(p.ctx, id); err != nil {
			p.mu.Lock()
			stillWanted := p.held[id] && !p.closed
			p.mu.Unlock()
			if stillWanted {
				p.logf("caclient: prefetching the certificate for %s: %v", id, err)
			}
		}
	}
}

// Close stops prefetching and waits for the workers. Certificates already
// fetched stay in the store. Close is idempotent.
func (p *Prefetcher) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
}
