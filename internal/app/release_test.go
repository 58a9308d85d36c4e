package app

import (
	"context"
	"encoding/json"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

const mib = 1 << 20

// fakeHeap stands for the runtime under the releaser: allocations grow
// the heap's objects and no GC runs unless release forces one, as in a
// daemon whose burst of set-ups is over.
type fakeHeap struct {
	mu       sync.Mutex
	s        memSample
	releases int
}

func (f *fakeHeap) read() memSample {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s
}

// release is debug.FreeOSMemory: a GC frees what died, and every free page
// goes back to the OS.
func (f *fakeHeap) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s.released += f.s.reclaimable()
	f.s.objects, f.s.free = f.s.live, 0
	f.releases++
}

// alloc allocates n bytes that die at once.
func (f *fakeHeap) alloc(n uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s.allocs += n
	f.s.objects += n
}

// gc is a GC the runtime runs by itself: it frees the dead objects,
// leaving their pages free but resident.
func (f *fakeHeap) gc() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s.free += f.s.objects - f.s.live
	f.s.objects = f.s.live
}

// spend is CPU the daemon used.
func (f *fakeHeap) spend(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s.cpu += d
}

func (f *fakeHeap) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.releases
}

// startReleaser runs a releaser over a fake heap of live bytes in the
// test's bubble; it returns once the releaser waits for its first tick.
func startReleaser(t *testing.T, live uint64, gcOff bool) (*fakeHeap, *MemoryReleaseStats) {
	h := &fakeHeap{s: memSample{live: live, objects: live, gcOff: gcOff}}
	stats := &MemoryReleaseStats{}
	r := &memReleaser{interval: 10 * time.Second, read: h.read, release: h.release, stats: stats,
		log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	go r.run(ctx)
	synctest.Wait()
	return h, stats
}

// burst allocates 20 MiB/s for d, off the ticks (50 ms after a whole
// second), so that no allocation and tick share an instant.
func burst(h *fakeHeap, d time.Duration) {
	time.Sleep(50 * time.Millisecond)
	for range d / (100 * time.Millisecond) {
		h.alloc(2 * mib)
		time.Sleep(100 * time.Millisecond)
	}
}

// releasesAt sleeps until the bubble's clock reads at (since start) and
// says how many releases have run.
func releasesAt(h *fakeHeap, start time.Time, at time.Duration) int {
	time.Sleep(time.Until(start.Add(at)))
	return h.count()
}

// TestMemReleaserAfterBurst: the release runs on the third quiet tick
// after a burst, at most once per interval, and not again while there is
// nothing to reclaim.
func TestMemReleaserAfterBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		h, stats := startReleaser(t, 10*mib, false)
		burst(h, 2*time.Second) // allocations from 0.05 s to 1.95 s
		// Ticks at 1 s and 2 s see the burst; 3, 4 and 5 s are quiet.
		if n := releasesAt(h, start, 4500*time.Millisecond); n != 0 {
			t.Fatalf("%d releases before the third quiet tick", n)
		}
		if n := releasesAt(h, start, 5500*time.Millisecond); n != 1 {
			t.Fatalf("%d releases on the third quiet tick (5 s), want 1", n)
		}
		if got := stats.lastBytes.Load(); got != 40*mib {
			t.Fatalf("last release returned %d bytes, want the burst's 40 MiB", got)
		}
		// A second burst settles by 9 s, but the interval holds the release
		// until 15 s, 10 s after the first.
		burst(h, time.Second)
		if n := releasesAt(h, start, 14500*time.Millisecond); n != 1 {
			t.Fatalf("%d releases within the interval, want 1", n)
		}
		if n := releasesAt(h, start, 15500*time.Millisecond); n != 2 {
			t.Fatalf("%d releases once the interval is over, want 2", n)
		}
		// Quiet and nothing left to reclaim: no more releases.
		if n := releasesAt(h, start, 90*time.Second); n != 2 || stats.releases.Load() != 2 {
			t.Fatalf("%d releases (stats %d) with nothing to reclaim, want 2", n, stats.releases.Load())
		}
	})
}

// TestMemReleaserBusy: a daemon that keeps allocating collects by itself;
// the releaser stays out, however much is reclaimable.
func TestMemReleaserBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		h, _ := startReleaser(t, 10*mib, false)
		for i := range 600 { // 20 MiB/s for 60 s, a GC every 15 MiB
			time.Sleep(50 * time.Millisecond)
			h.alloc(mib)
			if i%15 == 14 {
				h.gc()
			}
			time.Sleep(50 * time.Millisecond)
		}
		if n := releasesAt(h, start, 60500*time.Millisecond); n != 0 {
			t.Fatalf("%d releases while busy", n)
		}
		// Once it stops, what its GCs left free goes back.
		if n := releasesAt(h, start, 63500*time.Millisecond); n != 1 {
			t.Fatalf("%d releases after the busy minute, want 1", n)
		}
	})
}

// TestMemReleaserServing: a daemon relaying traffic allocates next to
// nothing, but uses CPU: no forced GC delays its requests until the
// traffic stops.
func TestMemReleaserServing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		h, _ := startReleaser(t, 10*mib, false)
		burst(h, 2*time.Second) // set-ups, then 30 s of requests
		for range 300 {
			h.spend(10 * time.Millisecond) // 10% of a core
			time.Sleep(100 * time.Millisecond)
		}
		if n := releasesAt(h, start, 32500*time.Millisecond); n != 0 {
			t.Fatalf("%d releases while serving", n)
		}
		if n := releasesAt(h, start, 35500*time.Millisecond); n != 1 {
			t.Fatalf("%d releases once the traffic stopped, want 1", n)
		}
	})
}

// TestMemReleaserHonoursGOGCOff: an operator's GOGC=off means no GC before
// the memory limit, so no forced one either.
func TestMemReleaserHonoursGOGCOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		h, _ := startReleaser(t, 10*mib, true)
		burst(h, 2*time.Second)
		if n := releasesAt(h, start, time.Minute); n != 0 {
			t.Fatalf("%d releases under GOGC=off", n)
		}
	})
}

// TestMemReleaserWorth: a big live heap must free an eighth of itself to
// be worth a GC; a small one, releaseMinBytes.
func TestMemReleaserWorth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		h, _ := startReleaser(t, 100*mib, false)
		burst(h, 600*time.Millisecond) // 12 MiB dead, under 12.5 MiB
		if n := releasesAt(h, start, 30*time.Second); n != 0 {
			t.Fatalf("%d releases for 12 MiB over a 100 MiB live heap", n)
		}
		burst(h, 100*time.Millisecond) // 14 MiB
		if n := releasesAt(h, start, 34500*time.Millisecond); n != 1 {
			t.Fatalf("%d releases for 14 MiB over a 100 MiB live heap, want 1", n)
		}
	})
	for _, tc := range []struct {
		s    memSample
		want bool
	}{
		{memSample{live: mib, objects: mib + mib/2}, false},
		{memSample{live: mib, objects: mib + mib/2, free: mib / 2}, true},
		{memSample{live: 64 * mib, objects: 64*mib + 7*mib}, false},
		{memSample{live: 64 * mib, objects: 64*mib + 4*mib, free: 4 * mib}, true},
		{memSample{live: 8 * mib, objects: 4 * mib, free: mib / 2}, false}, // objects below live: swept since the GC
	} {
		if got := tc.s.worthReleasing(); got != tc.want {
			t.Errorf("%+v: worthReleasing %v, want %v", tc.s, got, tc.want)
		}
	}
}

// TestMemReleaserRuntime: the daemon's releaser on the real runtime reads
// its metrics, and a release after garbage and three quiet steps returns
// pages to the OS.
func TestMemReleaserRuntime(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	stats := &MemoryReleaseStats{}
	r := newMemReleaser(time.Minute, stats, slog.New(slog.DiscardHandler))
	if s := r.read(); s.allocs == 0 || s.objects == 0 || s.gcOff {
		t.Fatalf("runtime sample %+v", s)
	}
	r.prev = r.read()
	// 16 MiB of garbage, with no GC to free it before the releaser does (a
	// GC now would leave free pages the scavenger may return at any time).
	debug.SetGCPercent(-1)
	if s := r.read(); !s.gcOff {
		t.Fatal("GOGC=off not seen")
	}
	for range 64 {
		garbageSink = make([]byte, 256<<10)
	}
	garbageSink = nil
	debug.SetGCPercent(100)
	for i := range 4 { // one busy step, three quiet
		r.step(time.Now())
		if got, want := stats.releases.Load(), uint64(i/3); got != want {
			t.Fatalf("after step %d: %d releases, want %d (%+v)", i+1, got, want, r.read())
		}
	}
	if stats.lastBytes.Load() < 8<<20 {
		t.Fatalf("the release returned %d bytes to the OS, want most of 16 MiB", stats.lastBytes.Load())
	}
}

// TestMemoryReleaseSetting: ZTUNNEL_MEMORY_RELEASE_INTERVAL=0 turns the
// releaser off; on, its stats are in the config /config_dump shows.
func TestMemoryReleaseSetting(t *testing.T) {
	cfg, err := ParseEnv(lookupFrom(map[string]string{"ZTUNNEL_MEMORY_RELEASE_INTERVAL": "0"}))
	if err != nil {
		t.Fatal(err)
	}
	StartMemoryRelease(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if cfg.MemoryReleaseInterval != 0 || cfg.MemoryRelease != nil {
		t.Fatalf("off: interval %v, stats %v", cfg.MemoryReleaseInterval, cfg.MemoryRelease)
	}
	cfg = &Config{MemoryReleaseInterval: 30 * time.Second}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	StartMemoryRelease(ctx, cfg, slog.New(slog.DiscardHandler))
	cfg.MemoryRelease.releases.Add(2)
	cfg.MemoryRelease.lastBytes.Store(4096)
	cfg.MemoryRelease.lastUnix.Store(time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC).UnixNano())
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"MemoryReleaseInterval":30000000000`,
		`"MemoryRelease":{"releases":2,"lastReleasedBytes":4096,"lastReleaseAt":"2026-12-03T07:00:00Z"}`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("config JSON lacks %s:\n%s", want, b)
		}
	}
}

// garbageSink makes the test's allocations escape to the heap, so they are
// garbage for the GC rather than stack space the compiler may elide.
var garbageSink []byte
