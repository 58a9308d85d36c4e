package mtls

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
)

// ErrStoreClosed is returned by Store.Get after Store.Close.
var ErrStoreClosed = errors.New("mtls: certificate store closed")

// Source issues certificates: the Istio CA over gRPC, or the built-in CA.
type Source interface {
	// Fetch issues a new certificate for id. It must honour ctx, which is
	// cancelled when the Store closes or forgets id.
	Fetch(ctx context.Context, id identity.Identity) (*WorkloadCert, error)
}

// Retry timing after a failed refresh, as in ztunnel: exponential from 1s,
// doubling, ±20% jitter, at most 150s.
const (
	retryInitial = time.Second
	retryMax     = 150 * time.Second
	retryJitter  = 0.2
)

// minRefreshDelay is the shortest wait between a successful fetch and the
// next refresh. It only matters for a CA whose certificates arrive already
// past half-life (long backdating, short TTL), which would otherwise make the
// refresh loop spin against the CA.
const minRefreshDelay = time.Second

// StoreConfig configures a Store.
type StoreConfig struct {
	// Source issues the certificates. Required.
	Source Source
	// Logf receives background refresh failures. Nil discards them.
	Logf func(format string, args ...any)
	// Now is the clock for expiry and refresh decisions. Nil means time.Now.
	// Timers still run on real time.
	Now func() time.Time
}

// Store caches one certificate per identity, shared by every pod with that
// identity, and keeps each fresh: a goroutine owned by the Store refreshes a
// certificate at its RefreshAt, retrying failures with backoff while the old
// certificate, as long as it is valid, keeps being served.
//
// A Store is safe for concurrent use.
type Store struct {
	source Source
	logf   func(string, ...any)
	now    func() time.Time
	ctx    context.Context // cancelled by Close; parent of every entry's ctx
	cancel context.CancelFunc
	wg     sync.WaitGroup // every fetch and refresh goroutine

	mu sync.Mutex // guards the following fields
	// entries holds an entry per identity asked for and not forgotten.
	entries map[identity.Identity]*entry
	closed  bool
}

// entry is one identity's cache slot.
type entry struct {
	id     identity.Identity
	ctx    context.Context // cancelled by Forget or Close
	cancel context.CancelFunc

	// The following fields are guarded by Store.mu.
	cert     *WorkloadCert // last issued, possibly expired; nil before the first success
	lastErr  error         // the last fetch's failure; nil after a success (CertStates)
	inflight *call         // the fetch under way, shared by every waiter
	looping  bool          // the refresh goroutine has been started
}

// call is one Fetch, awaited by any number of callers.
type call struct {
	done chan struct{} // closed when cert and err are set
	cert *WorkloadCert
	err  error
}

// NewStore returns a Store issuing certificates from cfg.Source. Close it to
// stop its goroutines.
func NewStore(cfg StoreConfig) *Store {
	if cfg.Source == nil {
		panic("mtls: NewStore without a Source")
	}
	s := &Store{
		source:  cfg.Source,
		logf:    cfg.Logf,
		now:     cfg.Now,
		entries: make(map[identity.Identity]*entry),
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Get returns id's certificate, fetching it on a miss. Concurrent misses for
// one identity share one Fetch. An expired certificate is never returned:
// once the cached one has expired, Get fetches anew and returns that
// fetch's error if it fails. ctx bounds only this caller's wait; the shared
// fetch goes on for the others.
func (s *Store) Get(ctx context.Context, id identity.Identity) (*WorkloadCert, error) {
	if id.IsZero() {
		return nil, fmt.Errorf("%w: certificate requested for the empty identity", ErrNoIdentity)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrStoreClosed
	}
	e := s.entries[id]
	if e == nil {
		e = &entry{id: id}
		e.ctx, e.cancel = context.WithCancel(s.ctx)
		s.entries[id] = e
	}
	if c := e.cert; c != nil && s.now().Before(c.NotAfter) {
		s.mu.Unlock()
		return c, nil
	}
	cl := s.fetchLocked(e)
	s.mu.Unlock()

	select {
	case <-cl.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if cl.err != nil {
		return nil, cl.err
	}
	if !s.now().Before(cl.cert.NotAfter) {
		return nil, fmt.Errorf("mtls: certificate issued for %s expired at %s", id, cl.cert.NotAfter.Format(time.RFC3339))
	}
	return cl.cert, nil
}

// fetchLocked returns e's fetch under way, starting one if there is none.
func (s *Store) fetchLocked(e *entry) *call {
	if e.inflight != nil {
		return e.inflight
	}
	cl := &call{done: make(chan struct{})}
	e.inflight = cl
	s.wg.Add(1)
	go s.runFetch(e, cl)
	return cl
}

// runFetch performs one Fetch and publishes its result.
func (s *Store) runFetch(e *entry, cl *call) {
	defer s.wg.Done()
	c, err := s.source.Fetch(e.ctx, e.id)
	switch {
	case err != nil:
		err = fmt.Errorf("mtls: fetching certificate for %s: %w", e.id, err)
	case c == nil:
		err = fmt.Errorf("mtls: fetching certificate for %s: source returned no certificate", e.id)
	case c.Identity != e.id:
		err = fmt.Errorf("%w: source issued %s for %s", ErrIdentityMismatch, c.Identity, e.id)
	}
	if err != nil {
		c = nil
	}
	cl.cert, cl.err = c, err

	s.mu.Lock()
	e.inflight = nil
	// A forgotten entry keeps nothing; its waiters still get the result.
	if err != nil {
		e.lastErr = err
	}
	if !s.closed && s.entries[e.id] == e {
		if c != nil {
			e.cert, e.lastErr = c, nil
		}
		// After a first fetch that failed too (the CA down at start, istiod
		// restarting): the loop retries with backoff, as ztunnel's identity
		// manager does, so the certificate is Available again without a
		// connection asking for it.
		if !e.looping {
			e.looping = true
			s.wg.Add(1)
			go s.refreshLoop(e, err != nil)
		}
	}
	s.mu.Unlock()
	close(cl.done)
}

// refreshLoop keeps e's certificate fresh until e is forgotten or the Store
// closes. It sleeps until the current certificate's refresh point, fetches
// (sharing the fetch with any Get under way), and after a failure retries
// with backoff. A certificate that a Get fetched in the meantime moves the
// refresh point rather than causing a second fetch. failed: the loop starts
// after a first fetch that failed, with no certificate yet, so it begins
// with the first retry's wait.
func (s *Store) refreshLoop(e *entry, failed bool) {
	defer s.wg.Done()
	failures := 0
	wait := s.refreshDelay(s.current(e))
	if failed {
		wait, failures = retryDelay(0), 1
		s.logf("mtls: certificate fetch for %s failed; retrying in %s", e.id, wait.Round(time.Millisecond))
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-timer.C:
		}
		// nil only until the first fetch succeeds; nothing clears it.
		cur := s.current(e)
		if cur != nil && s.now().Before(cur.RefreshAt()) {
			failures = 0
			timer.Reset(s.refreshDelay(cur))
			continue
		}

		s.mu.Lock()
		cl := s.fetchLocked(e)
		s.mu.Unlock()
		select {
		case <-e.ctx.Done():
			return
		case <-cl.done:
		}
		if cl.err == nil {
			failures = 0
			timer.Reset(s.refreshDelay(cl.cert))
			continue
		}

		delay := retryDelay(failures)
		failures++
		if cur == nil {
			s.logf("mtls: certificate fetch failed (%v); retrying in %s", cl.err, delay.Round(time.Millisecond))
		} else if left := cur.NotAfter.Sub(s.now()); left > 0 {
			// Retry no later than the old certificate's expiry, when Gets
			// would start failing.
			delay = min(delay, left)
			s.logf("mtls: certificate refresh failed (%v); serving the current one until %s, retrying in %s",
				cl.err, cur.NotAfter.Format(time.RFC3339), delay.Round(time.Millisecond))
		} else {
			s.logf("mtls: certificate refresh failed (%v) and the current one has expired; retrying in %s",
				cl.err, delay.Round(time.Millisecond))
		}
		timer.Reset(delay)
	}
}

// current returns e's last issued certificate.
func (s *Store) current(e *entry) *WorkloadCert {
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.cert
}

// refreshDelay returns how long to wait before refreshing c.
func (s *Store) refreshDelay(c *WorkloadCert) time.Duration {
	if c == nil {
		return minRefreshDelay
	}
	return max(c.RefreshAt().Sub(s.now()), minRefreshDelay)
}

// retryDelay returns the wait after the (failures+1)-th consecutive failure.
func retryDelay(failures int) time.Duration {
	d := retryMax
	if failures < 16 { // 2^16 s is far past the cap; avoids shift overflow
		d = min(retryInitial<<failures, retryMax)
	}
	jitter := 1 + retryJitter*(2*rand.Float64()-1)
	return min(time.Duration(float64(d)*jitter), retryMax)
}

// Forget drops id's certificate and stops refreshing it, for when the last
// workload with that identity leaves the node. A fetch under way is
// cancelled; its waiters get the error.
func (s *Store) Forget(id identity.Identity) {
	s.mu.Lock()
	e := s.entries[id]
	delete(s.entries, id)
	s.mu.Unlock()
	if e != nil {
		e.cancel()
	}
}

// Certificates returns the cached certificates sorted by identity, for
// /config_dump. A certificate that has expired while its refresh keeps
// failing is included; the dump shows its validity.
func (s *Store) Certificates() []*WorkloadCert {
	s.mu.Lock()
	out := make([]*WorkloadCert, 0, len(s.entries))
	for _, e := range s.entries {
		if e.cert != nil {
			out = append(out, e.cert)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b *WorkloadCert) int {
		return cmp.Compare(a.Identity.String(), b.Identity.String())
	})
	return out
}

// Close cancels every fetch and refresh and waits for their goroutines to
// end. Gets after Close fail with ErrStoreClosed. Close is idempotent.
func (s *Store) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}
