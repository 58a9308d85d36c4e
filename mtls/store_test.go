package mtls_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

var errCADown = errors.New("fake CA down")

// fakeSource issues synthetic certificates (validity only, no key material:
// the Store reads nothing else) and counts its fetches.
type fakeSource struct {
	lifetime time.Duration
	now      func() time.Time // nil: time.Now
	gate     chan struct{}    // non-nil: Fetch waits for it to close
	issueAs  identity.Identity
	fail     atomic.Bool
	fetches  atomic.Int32
}

func (f *fakeSource) Fetch(ctx context.Context, id identity.Identity) (*mtls.WorkloadCert, error) {
	f.fetches.Add(1)
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if f.fail.Load() {
		return nil, errCADown
	}
	now := time.Now()
	if f.now != nil {
		now = f.now()
	}
	if !f.issueAs.IsZero() {
		id = f.issueAs
	}
	return &mtls.WorkloadCert{Identity: id, NotBefore: now, NotAfter: now.Add(f.lifetime)}, nil
}

// countingSource counts the fetches of a real Source.
type countingSource struct {
	src     mtls.Source
	fetches atomic.Int32
}

func (c *countingSource) Fetch(ctx context.Context, id identity.Identity) (*mtls.WorkloadCert, error) {
	c.fetches.Add(1)
	return c.src.Fetch(ctx, id)
}

func get(t *testing.T, s *mtls.Store, id identity.Identity) *mtls.WorkloadCert {
	t.Helper()
	c, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%v): %v", id, err)
	}
	return c
}

var storeID = identity.New("", "ns", "sa")

func TestStoreCoalesces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{lifetime: 24 * time.Hour, gate: make(chan struct{})}
		s := mtls.NewStore(mtls.StoreConfig{Source: src})
		defer s.Close()

		var wg sync.WaitGroup
		got := make([]*mtls.WorkloadCert, 10)
		for i := range got {
			wg.Go(func() {
				c, err := s.Get(context.Background(), storeID)
				if err != nil {
					t.Errorf("Get: %v", err)
				}
				got[i] = c
			})
		}
		synctest.Wait() // every Get is now waiting on the one fetch
		n := src.fetches.Load()
		close(src.gate)
		wg.Wait()
		if n != 1 {
			t.Fatalf("%d fetches for 10 concurrent Gets, want 1", n)
		}
		for i, c := range got {
			if c == nil || c != got[0] {
				t.Fatalf("Get %d returned %p, want the shared %p", i, c, got[0])
			}
		}
		if c := get(t, s, storeID); c != got[0] || src.fetches.Load() != 1 {
			t.Fatal("a later Get was not served from the cache")
		}
	})
}

func TestStoreRefreshesAtHalfLife(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The real issuing path; the CA lives in the bubble's clock too.
		ca := tlstest.NewCA(t, "")
		src := &countingSource{src: caclient.New(caclient.Config{Signer: ca})}
		s := mtls.NewStore(mtls.StoreConfig{Source: src})
		defer s.Close()

		c1 := get(t, s, storeID)
		time.Sleep(time.Until(c1.RefreshAt()) - time.Minute)
		synctest.Wait()
		if n := src.fetches.Load(); n != 1 {
			t.Fatalf("%d fetches before half-life, want 1", n)
		}
		if get(t, s, storeID) != c1 {
			t.Fatal("certificate replaced before half-life")
		}

		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if n := src.fetches.Load(); n != 2 {
			t.Fatalf("%d fetches after half-life, want 2", n)
		}
		c2 := get(t, s, storeID)
		if c2.SerialNumber() == c1.SerialNumber() || !c2.NotAfter.After(c1.NotAfter) {
			t.Fatalf("after half-life serving serial %s (until %v), want a new certificate", c2.SerialNumber(), c2.NotAfter)
		}
		if certs := s.Certificates(); len(certs) != 1 || certs[0] != c2 {
			t.Fatalf("Certificates() = %v, want the new one", certs)
		}
	})
}

func TestStoreKeepsCertWhileRefreshFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logged atomic.Int32
		src := &fakeSource{lifetime: 24 * time.Hour}
		s := mtls.NewStore(mtls.StoreConfig{
			Source: src,
			Logf: func(format string, args ...any) {
				if strings.Contains(format, "refresh failed") {
					logged.Add(1)
				}
			},
		})
		defer s.Close()

		c1 := get(t, s, storeID)
		src.fail.Store(true)
		time.Sleep(12*time.Hour + time.Second)
		synctest.Wait()
		if n := src.fetches.Load(); n < 2 {
			t.Fatalf("%d fetches, want a refresh attempt at half-life", n)
		}
		if get(t, s, storeID) != c1 {
			t.Fatal("failed refresh did not keep the valid certificate")
		}

		// Retries back off: 1s doubling to 150s. An hour holds about 30 of
		// them; a spinning loop would make thousands, a stuck one none.
		before := src.fetches.Load()
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := src.fetches.Load() - before; n < 15 || n > 60 {
			t.Fatalf("%d retries in an hour, want about 30", n)
		}
		if logged.Load() == 0 {
			t.Fatal("refresh failures were not logged")
		}

		time.Sleep(time.Until(c1.NotAfter) + time.Second)
		synctest.Wait()
		if c, err := s.Get(context.Background(), storeID); !errors.Is(err, errCADown) {
			t.Fatalf("after expiry Get = %p, %v; want the CA's error, not the expired certificate", c, err)
		}

		src.fail.Store(false)
		c3 := get(t, s, storeID)
		if c3 == c1 || !c3.NotAfter.After(time.Now()) {
			t.Fatal("recovery did not issue a fresh certificate")
		}
		// The certificate Get fetched moves the refresh point: no fetches
		// until its own half-life.
		synctest.Wait()
		n := src.fetches.Load()
		time.Sleep(11 * time.Hour)
		synctest.Wait()
		if got := src.fetches.Load(); got != n {
			t.Fatalf("%d fetches after recovery before half-life, want none", got-n)
		}
	})
}

func TestStoreNeverReturnsExpired(t *testing.T) {
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	src := &fakeSource{lifetime: time.Hour, now: now}
	s := mtls.NewStore(mtls.StoreConfig{Source: src, Now: now})
	defer s.Close()

	c1 := get(t, s, storeID)
	offset.Store(int64(2 * time.Hour))
	src.fail.Store(true)
	if c, err := s.Get(context.Background(), storeID); !errors.Is(err, errCADown) {
		t.Fatalf("Get of an expired identity = %p, %v; want the CA's error", c, err)
	}
	src.fail.Store(false)
	if c2 := get(t, s, storeID); c2 == c1 || !c2.NotAfter.After(now()) {
		t.Fatal("Get did not fetch a fresh certificate after expiry")
	}

	// A source that hands out an already expired certificate.
	stale := &fakeSource{lifetime: -time.Second}
	s2 := mtls.NewStore(mtls.StoreConfig{Source: stale})
	defer s2.Close()
	if _, err := s2.Get(context.Background(), storeID); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Get of an expired fetch: %v, want an expiry error", err)
	}
}

func TestStoreForgetAndCertificates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{lifetime: 24 * time.Hour}
		s := mtls.NewStore(mtls.StoreConfig{Source: src})
		defer s.Close()

		ids := []identity.Identity{
			identity.New("", "ns-c", "sa"),
			identity.New("", "ns-a", "sa"),
			identity.New("", "ns-b", "sa"),
		}
		for _, id := range ids {
			get(t, s, id)
		}
		var got []string
		for _, c := range s.Certificates() {
			got = append(got, c.Identity.Namespace)
		}
		if strings.Join(got, ",") != "ns-a,ns-b,ns-c" {
			t.Fatalf("Certificates() in order %v, want sorted by identity", got)
		}

		s.Forget(ids[0])
		s.Forget(identity.New("", "never", "seen"))
		if n := len(s.Certificates()); n != 2 {
			t.Fatalf("%d certificates after Forget, want 2", n)
		}
		// The forgotten identity's refresh has stopped: half a lifetime later
		// only the two others were refreshed.
		time.Sleep(13 * time.Hour)
		synctest.Wait()
		if n := src.fetches.Load(); n != 5 {
			t.Fatalf("%d fetches, want 3 initial + 2 refreshes", n)
		}
		get(t, s, ids[0])
		if n := src.fetches.Load(); n != 6 {
			t.Fatalf("Get after Forget did not fetch anew (%d fetches)", n)
		}
	})
}

func TestStoreGetContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{lifetime: time.Hour, gate: make(chan struct{})}
		s := mtls.NewStore(mtls.StoreConfig{Source: src})
		defer s.Close()

		ctx, cancel := context.WithCancel(context.Background())
		impatient := make(chan error, 1)
		go func() {
			_, err := s.Get(ctx, storeID)
			impatient <- err
		}()
		patient := make(chan error, 1)
		go func() {
			_, err := s.Get(context.Background(), storeID)
			patient <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-impatient; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Get returned %v", err)
		}
		close(src.gate)
		if err := <-patient; err != nil {
			t.Fatalf("the other waiter lost the shared fetch: %v", err)
		}
		if n := src.fetches.Load(); n != 1 {
			t.Fatalf("%d fetches, want 1", n)
		}
	})
}

func TestStoreRejectsWrongIdentity(t *testing.T) {
	src := &fakeSource{lifetime: time.Hour, issueAs: identity.New("", "ns", "other")}
	s := mtls.NewStore(mtls.StoreConfig{Source: src})
	defer s.Close()
	if _, err := s.Get(context.Background(), storeID); !errors.Is(err, mtls.ErrIdentityMismatch) {
		t.Fatalf("Get = %v, want ErrIdentityMismatch", err)
	}
	if _, err := s.Get(context.Background(), identity.Identity{}); !errors.Is(err, mtls.ErrNoIdentity) {
		t.Fatalf("Get of the zero identity = %v, want ErrNoIdentity", err)
	}
}

// TestStoreClose runs the Store on real time with real certificates and
// checks that Close leaves no goroutine behind: refresh loops, a fetch in
// flight, and its waiter.
func TestStoreClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	synctest.Test(t, testStoreClose)
}

// testStoreClose runs in a synctest bubble: the blocked fetch is seen to
// have started exactly (synctest.Wait), and every goroutine the stores
// started must have ended when the bubble does.
func testStoreClose(t *testing.T) {
	ca := tlstest.NewCA(t, "")
	s := mtls.NewStore(mtls.StoreConfig{Source: caclient.New(caclient.Config{Signer: ca, TTL: 2 * time.Second})})
	for _, sa := range []string{"a", "b", "c"} {
		get(t, s, identity.New("", "ns", sa))
	}

	gated := &fakeSource{gate: make(chan struct{})}
	blocked := mtls.NewStore(mtls.StoreConfig{Source: gated})
	waiter := make(chan error, 1)
	go func() {
		_, err := blocked.Get(context.Background(), storeID)
		waiter <- err
	}()
	synctest.Wait()
	if gated.fetches.Load() != 1 {
		t.Fatal("the blocked fetch never started")
	}

	s.Close()
	s.Close() // idempotent
	blocked.Close()
	if err := <-waiter; !errors.Is(err, context.Canceled) {
		t.Fatalf("Get in flight at Close returned %v, want context.Canceled", err)
	}
	if _, err := s.Get(context.Background(), storeID); !errors.Is(err, mtls.ErrStoreClosed) {
		t.Fatalf("Get after Close = %v, want ErrStoreClosed", err)
	}
}

// TestStoreRetriesFailedFirstFetch: a certificate whose first fetch failed
// (the CA down when the pod came) is retried in the background with
// backoff, and is Available once the CA is back without any Get asking.
func TestStoreRetriesFailedFirstFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{lifetime: 24 * time.Hour}
		src.fail.Store(true)
		s := mtls.NewStore(mtls.StoreConfig{Source: src})
		defer s.Close()
		if _, err := s.Get(context.Background(), storeID); !errors.Is(err, errCADown) {
			t.Fatalf("Get with the CA down: %v", err)
		}
		if st := s.CertStates(); len(st) != 1 || !strings.HasPrefix(st[0].State(), mtls.CertUnavailable) {
			t.Fatalf("states %v, want one Unavailable", st)
		}
		// Backoff: a minute of outage holds a handful of retries.
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := src.fetches.Load(); n < 4 || n > 12 {
			t.Fatalf("%d fetches in the first minute of the outage, want a few retries with backoff", n)
		}
		src.fail.Store(false)
		time.Sleep(2*time.Minute + time.Second) // at most one capped wait (150 s ±20%)
		synctest.Wait()
		if st := s.CertStates(); len(st) != 1 || st[0].State() != mtls.CertAvailable {
			t.Fatalf("states %v after the CA came back, want Available without a Get", st)
		}
		// Recovered: no more fetches until the half-life.
		n := src.fetches.Load()
		time.Sleep(11 * time.Hour)
		synctest.Wait()
		if got := src.fetches.Load(); got != n {
			t.Fatalf("%d fetches after recovery, want none before half-life", got-n)
		}
	})
}
