package fdbudget

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	peerA = netip.MustParseAddr("10.0.0.1")
	peerB = netip.MustParseAddr("10.0.0.2")
	peerC = netip.MustParseAddr("fd00::3")
	peerD = netip.MustParseAddr("10.0.0.4")
)

// step is one Acquire (n > 0) or Release (n < 0) of a table case.
type step struct {
	peer netip.Addr
	n    int
	want Reason // for an Acquire
}

func TestAcquireRule(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
		used  int // after the steps
	}{
		{"a lone peer stops at half the total", Config{Total: 10, Floor: -1}, []step{
			{peerA, 5, OK}, {peerA, 1, OverPeer},
		}, 5},
		{"a lone peer stops at half the total, unit by unit", Config{Total: 11, Floor: -1}, []step{
			{peerA, 1, OK}, {peerA, 1, OK}, {peerA, 1, OK}, {peerA, 1, OK}, {peerA, 1, OK}, {peerA, 1, OverPeer},
		}, 5},
		{"another peer gets in while one holds its half", Config{Total: 10, Floor: -1}, []step{
			// B may hold what stays free after its take: 2 of the 5.
			{peerA, 5, OK}, {peerB, 2, OK}, {peerB, 1, OverPeer}, {peerA, 1, OverPeer}, {peerC, 1, OK},
		}, 8},
		{"the floor is every peer's whatever the others hold", Config{Total: 10, Floor: 2}, []step{
			{peerA, 5, OK}, {peerB, 2, OK}, {peerC, 2, OK}, {peerC, 1, OverPeer},
			{peerD, 2, OverTotal}, {peerD, 1, OK},
		}, 10},
		{"the floor does not pass the total", Config{Total: 4, Floor: 8}, []step{
			{peerA, 4, OK}, {peerB, 1, OverTotal},
		}, 4},
		{"a take bigger than what is left", Config{Total: 10, Floor: -1}, []step{
			{peerA, 11, OverTotal}, {peerA, 6, OverPeer},
		}, 0},
		{"a release makes room again", Config{Total: 10, Floor: -1}, []step{
			{peerA, 5, OK}, {peerA, 1, OverPeer}, {peerA, -2, OK}, {peerA, 1, OK}, {peerA, 1, OK}, {peerA, 1, OverPeer},
		}, 5},
		{"IPv4-mapped IPv6 is the same peer", Config{Total: 10, Floor: -1}, []step{
			{peerA, 4, OK}, {netip.AddrFrom16(peerA.As16()), 1, OK}, {netip.AddrFrom16(peerA.As16()), 1, OverPeer},
		}, 5},
		{"a zone does not make another peer", Config{Total: 10, Floor: -1}, []step{
			{peerC, 5, OK}, {peerC.WithZone("eth0"), 1, OverPeer},
		}, 5},
		{"the default floor", Config{Total: 20}, []step{
			{peerA, DefaultFloor, OK}, {peerA, 1, OverPeer},
		}, DefaultFloor},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := New(tc.cfg)
			for i, s := range tc.steps {
				if s.n < 0 {
					b.Release(s.peer, -s.n)
					continue
				}
				if got := b.Acquire(s.peer, s.n); got != s.want {
					t.Fatalf("step %d: Acquire(%v, %d) = %v, want %v (used %d)", i, s.peer, s.n, got, s.want, b.Used())
				}
			}
			if b.Used() != tc.used {
				t.Errorf("used %d, want %d", b.Used(), tc.used)
			}
		})
	}
}

// TestNilBudgetIsUnlimited: a proxy built without a budget takes the same
// calls.
func TestNilBudgetIsUnlimited(t *testing.T) {
	var b *Budget
	if New(Config{}) != nil {
		t.Fatal("New with no total made a budget")
	}
	for range 3 {
		if r := b.Acquire(peerA, 1<<20); r != OK {
			t.Fatalf("nil budget refused: %v", r)
		}
	}
	b.Release(peerA, 5)
	if b.Used() != 0 || b.Held(peerA) != 0 || b.Total() != 0 || b.Stats() != (Stats{}) {
		t.Fatal("nil budget holds something")
	}
	if log, _ := b.LogRefusal(); log {
		t.Fatal("nil budget logs refusals")
	}
}

// model is the rule written out without shards or atomics.
type model struct {
	total, floor int
	held         map[netip.Addr]int
	used         int
}

func (m *model) acquire(p netip.Addr, n int) Reason {
	h := m.held[p]
	free := m.total - m.used - n
	switch {
	case free < 0:
		return OverTotal
	case h+n > m.floor && h+n > free:
		return OverPeer
	}
	m.held[p] += n
	m.used += n
	return OK
}

// TestAgainstModel runs random sequences on one goroutine and compares
// every outcome and holding with the model's, and checks the bounds after
// each step: the sum never exceeds the total, and a peer that took last
// holds at most the floor or what is left free.
func TestAgainstModel(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			total := 1 + rng.IntN(200)
			floor := rng.IntN(8) - 1
			b := New(Config{Total: total, Floor: floor})
			m := &model{total: total, floor: max(floor, 0), held: map[netip.Addr]int{}}
			if floor == 0 {
				m.floor = DefaultFloor
			}
			peers := make([]netip.Addr, 1+rng.IntN(6))
			for i := range peers {
				peers[i] = netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
			}
			for i := range 5000 {
				p := peers[rng.IntN(len(peers))]
				if rng.IntN(3) == 0 && m.held[p] > 0 {
					n := 1 + rng.IntN(m.held[p])
					b.Release(p, n)
					m.held[p] -= n
					m.used -= n
					continue
				}
				n := 1 + rng.IntN(3)
				want := m.acquire(p, n)
				if got := b.Acquire(p, n); got != want {
					t.Fatalf("step %d: Acquire(%v, %d) = %v, model says %v", i, p, n, got, want)
				}
				if b.Used() != m.used || b.Used() > total {
					t.Fatalf("step %d: used %d, model %d, total %d", i, b.Used(), m.used, total)
				}
				if want == OK && m.held[p] > max(m.floor, total-m.used) {
					t.Fatalf("step %d: %v holds %d past its bound", i, p, m.held[p])
				}
				if b.Held(p) != m.held[p] {
					t.Fatalf("step %d: %v holds %d, model %d", i, p, b.Held(p), m.held[p])
				}
			}
			if b.Stats().Unbalanced != 0 {
				t.Fatal("unbalanced releases")
			}
		})
	}
}

// TestConcurrentBounds: peers take and give back from many goroutines at
// once; a watcher checks the sum never exceeds the total, a lone flooder's
// holding stays within its bound, and once everyone has given everything
// back the budget is empty, with no unbalanced release.
func TestConcurrentBounds(t *testing.T) {
	const total, floor = 1000, 4
	b := New(Config{Total: total, Floor: floor})
	var stop atomic.Bool
	var over atomic.Int64
	var watch sync.WaitGroup
	watch.Go(func() {
		for !stop.Load() {
			if u := b.Used(); u > total {
				over.Store(int64(u))
			}
		}
	})
	// A lone peer first: it can never hold more than half.
	var wg sync.WaitGroup
	var flooderMax atomic.Int64
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			mine := 0
			for range 20000 {
				if rng.IntN(4) == 0 && mine > 0 {
					b.Release(peerA, 1)
					mine--
				} else if b.Acquire(peerA, 1) == OK {
					mine++
				}
				if h := int64(b.Held(peerA)); h > flooderMax.Load() {
					flooderMax.Store(h)
				}
			}
			b.Release(peerA, mine)
		})
	}
	wg.Wait()
	if m := flooderMax.Load(); m > total/2 {
		t.Errorf("a lone peer held %d, past half the total %d", m, total)
	}
	// Then many peers at once.
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			held := map[netip.Addr]int{}
			for range 20000 {
				p := netip.AddrFrom4([4]byte{10, 1, byte(g), byte(rng.IntN(16))})
				if rng.IntN(3) == 0 && held[p] > 0 {
					n := 1 + rng.IntN(held[p])
					b.Release(p, n)
					held[p] -= n
				} else if n := 1 + rng.IntN(2); b.Acquire(p, n) == OK {
					held[p] += n
				}
			}
			for p, n := range held {
				b.Release(p, n)
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	watch.Wait()
	if u := over.Load(); u != 0 {
		t.Errorf("used reached %d, past the total %d", u, total)
	}
	st := b.Stats()
	if st.Used != 0 || st.Peers != 0 || st.Unbalanced != 0 {
		t.Errorf("after every release: %+v, want nothing held", st)
	}
	if st.RefusedPeer == 0 {
		t.Error("no refusal: the test did not press on the bounds")
	}
}

func TestUnbalancedRelease(t *testing.T) {
	b := New(Config{Total: 10})
	b.Acquire(peerA, 2)
	b.Release(peerA, 3)
	b.Release(peerB, 1)
	if st := b.Stats(); st.Used != 0 || st.Unbalanced != 2 || st.Peers != 0 {
		t.Fatalf("%+v, want nothing held and 2 unbalanced releases", st)
	}
}

// TestLogRefusal: the first refusal is logged, then one per interval,
// doubling while refusals keep coming, with the count of those not logged;
// after a quiet spell the interval starts over.
func TestLogRefusal(t *testing.T) {
	b := New(Config{Total: 1})
	now := time.Unix(1000, 0)
	b.gate.now = func() time.Time { return now }
	type tick struct {
		after    time.Duration // since the previous tick
		log      bool
		unlogged uint64
	}
	ticks := []tick{
		{0, true, 0},
		{100 * time.Millisecond, false, 0},
		{100 * time.Millisecond, false, 0},
		{time.Second, true, 2}, // 1.2 s after the first: past its 1 s
		{time.Second, false, 0},
		{1500 * time.Millisecond, true, 1}, // the interval was 2 s
		{3 * time.Second, false, 0},
		{1500 * time.Millisecond, true, 1}, // the interval was 4 s; now 8 s
		{20 * time.Second, true, 0},        // 12 s quiet after the 8 s: over
		{500 * time.Millisecond, false, 0}, // started over at 1 s
		{600 * time.Millisecond, true, 1},
	}
	for i, tk := range ticks {
		now = now.Add(tk.after)
		log, n := b.LogRefusal()
		if log != tk.log || n != tk.unlogged {
			t.Fatalf("tick %d: LogRefusal() = %v, %d, want %v, %d", i, log, n, tk.log, tk.unlogged)
		}
	}
	// The interval stops doubling at LogIntervalMax.
	for range 20 {
		now = time.Unix(0, b.gate.next.Load()) // refusals keep coming
		b.LogRefusal()
	}
	if b.gate.interval != LogIntervalMax {
		t.Fatalf("interval %v, want %v", b.gate.interval, LogIntervalMax)
	}
}

func TestDefaultReserve(t *testing.T) {
	for _, tc := range []struct {
		limit, loops, want int
	}{
		{1 << 20, 4, 1 << 17},                      // an eighth
		{65536, 4, 8192},                           // an eighth
		{4096, 4, reserveFixed + 4*reservePerLoop}, // the floor
		{4096, 0, reserveFixed + reservePerLoop},   // at least one loop
		{1024, 4, 512},                             // at most half
	} {
		if got := DefaultReserve(tc.limit, tc.loops); got != tc.want {
			t.Errorf("DefaultReserve(%d, %d) = %d, want %d", tc.limit, tc.loops, got, tc.want)
		}
	}
}

func TestNoFileLimit(t *testing.T) {
	if n := NoFileLimit(); n <= 0 {
		t.Fatalf("NoFileLimit() = %d", n)
	}
}

// BenchmarkAcquireRelease is one connection's take and give-back: one peer
// on one goroutine, and many peers on every core.
func BenchmarkAcquireRelease(b *testing.B) {
	b.Run("one peer", func(b *testing.B) {
		bu := New(Config{Total: 1 << 20})
		b.ReportAllocs()
		for b.Loop() {
			bu.Acquire(peerA, 2)
			bu.Release(peerA, 2)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/op")
	})
	b.Run("many peers parallel", func(b *testing.B) {
		bu := New(Config{Total: 1 << 20})
		var id atomic.Uint32
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			g := id.Add(1)
			i := 0
			for pb.Next() {
				p := netip.AddrFrom4([4]byte{10, byte(g), byte(i >> 8), byte(i)})
				i = (i + 1) & 1023
				bu.Acquire(p, 2)
				bu.Release(p, 2)
			}
		})
	})
	b.Run("holding 100k peers", func(b *testing.B) {
		bu := New(Config{Total: 1 << 22})
		for i := range 100000 {
			bu.Acquire(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 2)
		}
		b.ReportAllocs()
		for b.Loop() {
			bu.Acquire(peerB, 2)
			bu.Release(peerB, 2)
		}
	})
}
