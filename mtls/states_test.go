package mtls_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// TestCertStates walks one identity through ztunnel's dump states:
// Initializing while its first fetch is under way, Unavailable with the
// error after a failed one, Available once issued (also while a renewal
// fails and the certificate is still valid), Unavailable again once it
// expired with its renewal failing.
func TestCertStates(t *testing.T) {
	synctest.Test(t, testCertStates)
}

// testCertStates runs in a synctest bubble, so "the first fetch is under
// way" is observed exactly (synctest.Wait) rather than polled for.
func testCertStates(t *testing.T) {
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	gate := make(chan struct{})
	src := &fakeSource{lifetime: time.Hour, now: now, gate: gate}
	s := mtls.NewStore(mtls.StoreConfig{Source: src, Now: now})
	defer s.Close()
	state := func() mtls.CertState {
		t.Helper()
		st := s.CertStates()
		if len(st) != 1 || st[0].Identity != storeID {
			t.Fatalf("states %+v, want one for %s", st, storeID)
		}
		return st[0]
	}

	src.fail.Store(true)
	errc := make(chan error, 1)
	go func() { _, err := s.Get(context.Background(), storeID); errc <- err }()
	synctest.Wait() // Get is waiting on the gate
	if src.fetches.Load() != 1 {
		t.Fatalf("%d fetches under way, want 1", src.fetches.Load())
	}
	if got := state().State(); got != mtls.CertInitializing {
		t.Errorf("during the first fetch: %q, want Initializing", got)
	}
	close(gate)
	<-errc
	if st := state(); !strings.HasPrefix(st.State(), "Unavailable: ") || !strings.Contains(st.State(), errCADown.Error()) || st.Cert != nil {
		t.Errorf("after a failed fetch: %q (cert %v), want Unavailable with the error", st.State(), st.Cert)
	}

	src.fail.Store(false)
	c := get(t, s, storeID)
	if st := state(); st.State() != mtls.CertAvailable || st.Cert != c {
		t.Errorf("after a fetch: %q, want Available with the certificate", st.State())
	}

	// Expired with the renewal failing: Get fails, and so does the dump.
	src.fail.Store(true)
	offset.Store(int64(2 * time.Hour))
	if _, err := s.Get(context.Background(), storeID); err == nil {
		t.Fatal("Get returned an expired certificate")
	}
	if st := state(); !strings.HasPrefix(st.State(), "Unavailable: ") || st.Cert != nil {
		t.Errorf("expired with a failed renewal: %q, want Unavailable", st.State())
	}
}

func TestCertStateNames(t *testing.T) {
	id := identity.New("", "ns", "sa")
	for _, tc := range []struct {
		st   mtls.CertState
		want string
	}{
		{mtls.CertState{Identity: id}, "Initializing"},
		{mtls.CertState{Identity: id, Err: errCADown}, "Unavailable: fake CA down"},
		{mtls.CertState{Identity: id, Cert: &mtls.WorkloadCert{}}, "Available"},
	} {
		if got := tc.st.State(); got != tc.want {
			t.Errorf("State() = %q, want %q", got, tc.want)
		}
	}
}
