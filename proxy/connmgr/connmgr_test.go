package connmgr

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/state"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dst is the destination workload of every test connection.
var dst = &state.Workload{
	UID: "uid-dst", Name: "dst",
	Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, Protocol: state.ProtocolHBONE, Capacity: 1,
	Labels: &state.WorkloadLabels{Namespace: "ns1", ServiceAccount: "dst"},
}

func conn(sa string, srcPort uint16) state.Conn {
	return state.Conn{
		Src:         netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), srcPort),
		Dst:         netip.MustParseAddrPort("10.0.0.2:8080"),
		SrcIdentity: identity.Identity{TrustDomain: "cluster.local", Namespace: "client", ServiceAccount: sa},
		DstWorkload: dst,
	}
}

// allowOnly is a NAMESPACE ALLOW policy in ns1 admitting only client/<sa>.
func allowOnly(name, sa string) *state.Policy {
	return &state.Policy{
		Name: name, Namespace: "ns1", Scope: state.ScopeNamespace, Action: state.ActionAllow,
		Rules: [][][]state.Match{{{{ServiceAccounts: []state.ServiceAccountMatch{{Namespace: "client", ServiceAccount: sa}}}}}},
	}
}

func snapshot(t testing.TB, policies ...*state.Policy) *state.Snapshot {
	t.Helper()
	s, err := state.NewSnapshot([]*state.Workload{dst}, nil, policies)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// closeRecorder records close calls for one tracked connection.
type closeRecorder struct {
	n      atomic.Int32
	reason atomic.Pointer[string]
	done   chan struct{}
}

func newRecorder() *closeRecorder { return &closeRecorder{done: make(chan struct{})} }

func (r *closeRecorder) close(reason string) {
	r.reason.Store(&reason)
	if r.n.Add(1) == 1 {
		close(r.done)
	}
}

func (r *closeRecorder) closed() bool { return r.n.Load() > 0 }

// track authorizes c against snap, as the proxy does, then tracks it.
func track(t *testing.T, m *Manager, snap *state.Snapshot, c state.Conn, r *closeRecorder) *Tracked {
	t.Helper()
	if d := snap.Authorize(c); !d.Allowed {
		t.Fatalf("%v: not allowed to begin with: %s", c.SrcIdentity, d.Reason)
	}
	return m.Track(snap, c, r.close)
}

// runner runs m.Run and reports each snapshot Run has handled.
type runner struct {
	handled chan handled
	cancel  context.CancelFunc
	done    chan struct{}
}

type handled struct {
	snap      *state.Snapshot
	rechecked bool
}

func startRun(t *testing.T, m *Manager) *runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{handled: make(chan handled, 100), cancel: cancel, done: make(chan struct{})}
	m.observed = func(s *state.Snapshot, rechecked bool) { r.handled <- handled{s, rechecked} }
	go func() {
		defer close(r.done)
		m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// waitFor returns once Run has handled snap, and whether it re-checked.
func (r *runner) waitFor(t *testing.T, snap *state.Snapshot) bool {
	t.Helper()
	rechecked := false
	for h := range r.handled {
		rechecked = rechecked || h.rechecked
		if h.snap == snap {
			return rechecked
		}
	}
	panic("unreachable")
}

func TestPolicyPushClosesDeniedConnection(t *testing.T) {
	var logs strings.Builder
	var logMu sync.Mutex
	s0 := snapshot(t)
	st := state.NewStore(s0)
	m := New(Config{Store: st, Logf: func(f string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintf(&logs, f+"\n", args...)
	}})
	run := startRun(t, m)
	run.waitFor(t, s0)

	sleep, other := newRecorder(), newRecorder()
	track(t, m, s0, conn("sleep", 40001), sleep)
	track(t, m, s0, conn("other", 40002), other)
	if m.Len() != 2 {
		t.Fatalf("Len = %d, want 2", m.Len())
	}

	s1 := snapshot(t, allowOnly("only-sleep", "sleep"))
	st.Publish(s1)
	<-other.done
	if !run.waitFor(t, s1) {
		t.Fatal("a policy push did not re-check")
	}
	if sleep.closed() {
		t.Fatal("the connection the new policy still allows was closed")
	}
	if want := ClosedReason + ": " + state.ReasonNoAllowMatched; *other.reason.Load() != want {
		t.Fatalf("reason %q, want %q", *other.reason.Load(), want)
	}
	if m.Len() != 1 {
		t.Fatalf("Len = %d after the close, want 1", m.Len())
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), ClosedReason) || !strings.Contains(logs.String(), "client/sa/other") {
		t.Fatalf("log does not record the close:\n%s", logs.String())
	}
}

func TestWorkloadOnlyPublishDoesNotRecheck(t *testing.T) {
	s0 := snapshot(t, allowOnly("only-sleep", "sleep"))
	st := state.NewStore(s0)
	m := New(Config{Store: st})
	run := startRun(t, m)
	run.waitFor(t, s0)
	r := newRecorder()
	track(t, m, s0, conn("sleep", 40001), r)

	other := &state.Workload{UID: "uid-other", Name: "o", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.9")}, Capacity: 1, Labels: &state.WorkloadLabels{Namespace: "ns2"}}
	s1, err := s0.WithWorkloads([]*state.Workload{dst, other}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Publish(s1)
	if run.waitFor(t, s1) {
		t.Fatal("a workload-only publish (same policy generation) re-checked")
	}

	// The same policies compiled anew may differ, as far as anyone can
	// tell cheaply: that re-checks, and closes nothing.
	s2 := snapshot(t, allowOnly("only-sleep", "sleep"))
	st.Publish(s2)
	if !run.waitFor(t, s2) {
		t.Fatal("a new policy generation did not re-check")
	}
	if r.closed() || m.Len() != 1 {
		t.Fatalf("closed=%v Len=%d: equal policies closed a connection", r.closed(), m.Len())
	}
}

func TestUntrack(t *testing.T) {
	s0 := snapshot(t)
	m := New(Config{})
	r := newRecorder()
	tr := track(t, m, s0, conn("other", 40001), r)
	if got := tr.Conn().SrcIdentity.ServiceAccount; got != "other" {
		t.Fatalf("Conn() = %v", tr.Conn())
	}
	tr.Untrack()
	tr.Untrack() // idempotent
	if m.Len() != 0 {
		t.Fatalf("Len = %d after Untrack", m.Len())
	}
	if n := m.Recheck(snapshot(t, allowOnly("only-sleep", "sleep"))); n != 0 || r.closed() {
		t.Fatalf("Recheck closed %d, closed=%v: an untracked connection was closed", n, r.closed())
	}
}

func TestRecheck(t *testing.T) {
	s0 := snapshot(t)
	m := New(Config{})
	recs := map[string]*closeRecorder{}
	var trs []*Tracked
	for i, sa := range []string{"sleep", "other", "third"} {
		recs[sa] = newRecorder()
		trs = append(trs, track(t, m, s0, conn(sa, uint16(40000+i)), recs[sa]))
	}
	// A close function may untrack (the proxy's defer would): no deadlock.
	trs[1].c.(*funcConn).closeFn = func(reason string) { trs[1].Untrack(); recs["other"].close(reason) }

	deny := snapshot(t, allowOnly("only-sleep", "sleep"))
	if n := m.Recheck(deny); n != 2 {
		t.Fatalf("Recheck closed %d, want 2", n)
	}
	if recs["sleep"].closed() || !recs["other"].closed() || !recs["third"].closed() {
		t.Fatal("wrong connections closed")
	}
	// Closed connections are no longer tracked: no second close.
	if n := m.Recheck(snapshot(t, allowOnly("none", "nobody"))); n != 1 || recs["other"].n.Load() != 1 {
		t.Fatalf("second Recheck closed %d (want only sleep), other closed %d times", n, recs["other"].n.Load())
	}
	if m.Len() != 0 {
		t.Fatalf("Len = %d", m.Len())
	}
}

// TestTrackCatchesRacingPolicyChange: the proxy authorized against an older
// snapshot and the store already holds policies that deny the connection,
// which Run has re-checked before the connection was tracked.
func TestTrackCatchesRacingPolicyChange(t *testing.T) {
	old := snapshot(t)
	st := state.NewStore(snapshot(t, allowOnly("only-sleep", "sleep")))
	m := New(Config{Store: st})
	for _, tc := range []struct {
		name string
		snap *state.Snapshot
	}{{"older snapshot", old}, {"unknown snapshot", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			denied, allowed := newRecorder(), newRecorder()
			tr := m.Track(tc.snap, conn("other", 40001), denied.close)
			if !denied.closed() {
				t.Fatal("a connection the current policies deny was tracked")
			}
			tr.Untrack() // harmless after the close
			m.Track(tc.snap, conn("sleep", 40002), allowed.close).Untrack()
			if allowed.closed() {
				t.Fatal("a connection the current policies allow was closed")
			}
		})
	}
	if m.Len() != 0 {
		t.Fatalf("Len = %d", m.Len())
	}
}

func TestNilManager(t *testing.T) {
	var m *Manager
	tr := m.Track(nil, conn("sleep", 1), func(string) { t.Fatal("closed") })
	if tr != nil {
		t.Fatal("a nil Manager tracked")
	}
	tr.Untrack()
}

func TestRunWithoutStore(t *testing.T) {
	m := New(Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	cancel()
	<-done
}

func TestTrackAllocs(t *testing.T) {
	s0 := snapshot(t)
	m := New(Config{Store: state.NewStore(s0)})
	c := conn("sleep", 40001)
	closeFn := func(string) {}
	if n := testing.AllocsPerRun(1000, func() { m.Track(s0, c, closeFn).Untrack() }); n != 1 {
		t.Fatalf("Track+Untrack allocates %v times, want 1 (the entry)", n)
	}
}

// recordConn is a Conn of a test: its attributes and a close recorder.
type recordConn struct {
	c     state.Conn
	r     *closeRecorder
	reads atomic.Int32 // PolicyConn calls
}

func (rc *recordConn) PolicyConn() state.Conn    { rc.reads.Add(1); return rc.c }
func (rc *recordConn) PolicyClose(reason string) { rc.r.close(reason) }

// TestTrackConn: a Conn is re-checked through PolicyConn (nothing copied)
// and closed through PolicyClose, once, when a policy change denies it.
func TestTrackConn(t *testing.T) {
	s0 := snapshot(t)
	deny := snapshot(t, allowOnly("only-sleep", "sleep"))
	for _, tc := range []struct {
		name   string
		sa     string
		closed bool
	}{
		{"allowed by the new policy stays", "sleep", false},
		{"denied by the new policy is closed", "other", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{Store: state.NewStore(s0)})
			rc := &recordConn{c: conn(tc.sa, 40001), r: newRecorder()}
			tr := m.TrackConn(s0, rc)
			if got := tr.Conn(); got != rc.c {
				t.Fatalf("Conn() = %v, want %v", got, rc.c)
			}
			before := rc.reads.Load()
			closed := m.Recheck(deny)
			m.Recheck(deny) // a second re-check closes nothing more
			if rc.reads.Load() == before {
				t.Fatal("the re-check did not read the connection's attributes")
			}
			if got := rc.r.closed(); got != tc.closed || closed != map[bool]int{false: 0, true: 1}[tc.closed] {
				t.Fatalf("closed = %v (Recheck %d), want %v", got, closed, tc.closed)
			}
			if n := rc.r.n.Load(); n > 1 {
				t.Fatalf("closed %d times", n)
			}
			if r := rc.r.reason.Load(); tc.closed && !strings.HasPrefix(*r, ClosedReason) {
				t.Fatalf("reason %q", *r)
			}
			tr.Untrack()
			if m.Len() != 0 {
				t.Fatalf("Len = %d after Untrack", m.Len())
			}
		})
	}
}

func TestTrackConnAllocs(t *testing.T) {
	s0 := snapshot(t)
	m := New(Config{Store: state.NewStore(s0)})
	rc := &recordConn{c: conn("sleep", 40001), r: newRecorder()}
	if n := testing.AllocsPerRun(1000, func() { m.TrackConn(s0, rc).Untrack() }); n != 1 {
		t.Fatalf("TrackConn+Untrack allocates %v times, want 1 (the entry)", n)
	}
}

// TestConcurrent tracks and untracks from many goroutines while policies
// flip between allowing and denying half of the connections, and Recheck
// runs both from Run and directly. Run it with -race. Every connection is
// closed at most once, and only if some policy denied it.
func TestConcurrent(t *testing.T) {
	allowAll := snapshot(t)
	denyOther := snapshot(t, allowOnly("only-sleep", "sleep"))
	st := state.NewStore(allowAll)
	m := New(Config{Store: st})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { m.Run(ctx) })

	const workers, perWorker = 8, 300
	var workersWG sync.WaitGroup
	var closedSleep, closedTotal atomic.Int64
	for w := range workers {
		workersWG.Go(func() {
			var open []*Tracked
			for i := range perWorker {
				sa := "sleep"
				if i%2 == 1 {
					sa = "other"
				}
				var n atomic.Int32
				c := conn(sa, uint16(w*perWorker+i))
				open = append(open, m.Track(st.Load(), c, func(string) {
					if n.Add(1) > 1 {
						t.Error("closed twice")
					}
					closedTotal.Add(1)
					if sa == "sleep" {
						closedSleep.Add(1)
					}
				}))
				if i%3 == 0 {
					open[0].Untrack()
					open = open[1:]
				}
			}
			for _, tr := range open {
				tr.Untrack()
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			if i%2 == 0 {
				st.Publish(denyOther)
			} else {
				st.Publish(allowAll)
			}
			m.Recheck(st.Load())
			_ = m.Len()
		}
	})
	workersWG.Wait()
	cancel()
	wg.Wait()
	if closedSleep.Load() != 0 {
		t.Fatalf("%d allowed connections were closed", closedSleep.Load())
	}
	if m.Len() != 0 {
		t.Fatalf("Len = %d after every connection was untracked", m.Len())
	}
	t.Logf("%d connections closed by policy changes", closedTotal.Load())
}

// TestNoDeniedConnectionSurvives tracks connections, as the proxy does
// (Load, Authorize, Track), while policies flip; the last policy published
// denies half of them. Once Run has handled it and tracking is over, every
// denied connection must have been closed, including those authorized
// against an older snapshot and tracked after Run's last re-check.
func TestNoDeniedConnectionSurvives(t *testing.T) {
	allowAll := snapshot(t)
	denyOther := snapshot(t, allowOnly("only-sleep", "sleep"))
	st := state.NewStore(allowAll)
	m := New(Config{Store: st})
	var final atomic.Pointer[state.Snapshot]
	finalHandled := make(chan struct{})
	var once sync.Once
	m.observed = func(s *state.Snapshot, _ bool) {
		if s == final.Load() {
			once.Do(func() { close(finalHandled) })
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { m.Run(ctx) })

	const workers, perWorker = 4, 200
	type tracked struct {
		sa string
		r  *closeRecorder
	}
	results := make([][]tracked, workers)
	var workersWG sync.WaitGroup
	for w := range workers {
		workersWG.Go(func() {
			// Keep tracking until well after the last policy change was
			// handled, so that tracking overlaps every re-check.
			after := perWorker
			for i := 0; after > 0; i++ {
				select {
				case <-finalHandled:
					after--
				default:
				}
				sa := []string{"sleep", "other"}[i%2]
				c := conn(sa, uint16(w*100000+i))
				snap := st.Load()
				if !snap.Authorize(c).Allowed {
					continue // refused up front, never tracked
				}
				runtime.Gosched() // widen the window for a racing publish
				r := newRecorder()
				m.Track(snap, c, r.close)
				results[w] = append(results[w], tracked{sa, r})
			}
		})
	}
	for i := range 401 {
		if i%2 == 0 {
			st.Publish(allowAll)
		} else {
			st.Publish(denyOther)
		}
		runtime.Gosched()
	}
	// The last one is a new generation with the denying policies.
	last := snapshot(t, allowOnly("only-sleep", "sleep"))
	final.Store(last)
	st.Publish(last)
	workersWG.Wait()
	<-finalHandled

	open := 0
	for _, rs := range results {
		for _, tr := range rs {
			switch {
			case tr.sa == "other" && !tr.r.closed():
				t.Error("a connection the current policies deny is still open")
			case tr.sa == "sleep" && tr.r.closed():
				t.Error("a connection every policy allows was closed")
			case tr.sa == "sleep":
				open++
			}
		}
	}
	if m.Len() != open {
		t.Errorf("Len = %d, want %d", m.Len(), open)
	}
	cancel()
	wg.Wait()
}
