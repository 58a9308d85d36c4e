package app

import (
	"context"
	"encoding/json"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultMemoryReleaseInterval is ZTUNNEL_MEMORY_RELEASE_INTERVAL's
// default: at most one release of freed memory to the OS per interval.
//
// Why a release at all: a burst of connection set-ups (handshakes, HTTP/2
// HEADERS, the goroutines that dial) leaves garbage and free heap pages
// behind. Once the connections are idle the daemon allocates next to
// nothing, so no GC comes to free that garbage, and Go's background
// scavenger keeps up to ~10% above the heap goal resident: the RSS an idle
// connection costs then depends on whether a GC happened to run after the
// burst, and sync.Pool keeps the burst's buffers over the next one (issue
// 23: 4.3-8.2 KiB per idle HBONE-carried connection from run to run; 2.4-3.0
// KiB per daemon in zbench's hbone2 lab read 30 s after 5,000 opened). Two
// GCs and debug.FreeOSMemory, run once the burst has settled, leave the
// live heap and its partly used spans (2.2-2.6 KiB there), every run, for
// a few ms of CPU.
const DefaultMemoryReleaseInterval = 10 * time.Second

// The release policy (memReleaser.step). A tick reads six runtime
// metrics, which neither stops the world nor allocates, and getrusage(2).
const (
	// releaseTick is how often the policy looks at the heap.
	releaseTick = time.Second
	// releaseQuietTicks ticks in a row, each allocating less than
	// releaseQuietBytes and using less than releaseQuietCPU of the
	// process's CPU, make the daemon quiet: the burst is over, no GC is due
	// soon on its own, and no traffic is served that a GC's pauses and
	// mark workers would delay (the data path allocates next to nothing,
	// so 1,000 requests/s look quiet by allocations alone, not by CPU). A
	// busy daemon collects by itself.
	releaseQuietTicks = 3
	releaseQuietBytes = 1 << 20
	releaseQuietCPU   = releaseTick / 20 // 5% of a core
	// releaseMinBytes is the least reclaimable memory worth a forced GC
	// (5,000 idle connections leave ~2-3 MiB behind their burst); above a
	// live heap of 8x that, an eighth of the live heap: a GC's cost grows
	// with the live heap, so a big heap must free more to pay for one.
	releaseMinBytes = 1 << 20
)

// memSample is what the policy reads of the runtime each tick.
type memSample struct {
	allocs   uint64        // bytes allocated since start (/gc/heap/allocs:bytes)
	objects  uint64        // heap occupied by objects, live or dead not yet swept
	live     uint64        // heap marked live by the last GC (/gc/heap/live:bytes)
	free     uint64        // free heap pages still resident (/memory/classes/heap/free:bytes)
	released uint64        // heap pages returned to the OS (/memory/classes/heap/released:bytes)
	gcOff    bool          // GOGC=off: the operator wants no GC before the memory limit
	cpu      time.Duration // the process's user and system CPU since start
}

// reclaimable is what a GC and a full scavenge could return: what was
// allocated since the last GC (dead, mostly, after a burst; an upper
// bound) and the free pages already resident.
func (s memSample) reclaimable() uint64 {
	var dead uint64
	if s.objects > s.live {
		dead = s.objects - s.live
	}
	return dead + s.free
}

// worthReleasing says whether a release would return enough (see
// releaseMinBytes).
func (s memSample) worthReleasing() bool {
	return s.reclaimable() >= max(releaseMinBytes, s.live/8)
}

// runtimeMetrics are the runtime/metrics names memSample reads, in the
// order readRuntime expects them.
var runtimeMetrics = []string{
	"/gc/heap/allocs:bytes",
	"/memory/classes/heap/objects:bytes",
	"/gc/heap/live:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/released:bytes",
	"/gc/gogc:percent",
}

// readRuntime reads a memSample of this process into buf (reused between
// ticks, so that a tick allocates nothing).
func readRuntime(buf []metrics.Sample) memSample {
	metrics.Read(buf)
	u := func(i int) uint64 {
		if buf[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return buf[i].Value.Uint64()
	}
	// GOGC=off is a GC percent of -1, which the metric shows as uint64(-1).
	return memSample{allocs: u(0), objects: u(1), live: u(2), free: u(3), released: u(4), gcOff: int64(u(5)) < 0,
		cpu: processCPU()}
}

// processCPU is the process's CPU time from getrusage(2): the kernel's
// count, syscalls included (runtime/metrics' CPU classes are the Go
// scheduler's estimate); 0 if the call fails, which reads as quiet.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// MemoryReleaseStats are the releases done so far, live in /config_dump
// (under config, beside the interval that paces them).
type MemoryReleaseStats struct {
	releases  atomic.Uint64
	lastBytes atomic.Uint64 // heap returned to the OS by the last release
	lastUnix  atomic.Int64  // when, in Unix nanoseconds; 0: never
}

// MarshalJSON writes the stats as they are now.
func (s *MemoryReleaseStats) MarshalJSON() ([]byte, error) {
	d := struct {
		Releases      uint64     `json:"releases"`
		LastReleased  uint64     `json:"lastReleasedBytes"`
		LastReleaseAt *time.Time `json:"lastReleaseAt,omitempty"`
	}{Releases: s.releases.Load(), LastReleased: s.lastBytes.Load()}
	if ns := s.lastUnix.Load(); ns != 0 {
		at := time.Unix(0, ns).UTC()
		d.LastReleaseAt = &at
	}
	return json.Marshal(d)
}

// memReleaser returns to the OS what a burst of allocations freed, once
// the daemon has gone quiet, at most once per interval. read and release
// are runtime/metrics and debug.FreeOSMemory in the daemon, fakes in tests.
type memReleaser struct {
	interval time.Duration
	read     func() memSample
	release  func()
	stats    *MemoryReleaseStats
	log      *slog.Logger

	prev  memSample
	quiet int       // ticks in a row below releaseQuietBytes
	last  time.Time // the last release; zero: none yet
}

// newMemReleaser is the daemon's releaser, reporting into stats.
func newMemReleaser(interval time.Duration, stats *MemoryReleaseStats, log *slog.Logger) *memReleaser {
	buf := make([]metrics.Sample, len(runtimeMetrics))
	for i, n := range runtimeMetrics {
		buf[i].Name = n
	}
	return &memReleaser{
		interval: interval, stats: stats, log: log,
		read:    func() memSample { return readRuntime(buf) },
		release: releaseAll,
	}
}

// releaseAll is the daemon's release: two GCs, since a sync.Pool keeps
// what it holds over one (the record and frame buffers a burst left in the
// pools, ~0.1-0.2 KiB per connection of 5,000, go with the second), the
// second one debug.FreeOSMemory's, which then returns every free page.
func releaseAll() {
	runtime.GC()
	debug.FreeOSMemory()
}

// run ticks the policy until ctx ends.
func (r *memReleaser) run(ctx context.Context) {
	r.prev = r.read()
	t := time.NewTicker(releaseTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.step(now)
		}
	}
}

// step is one tick of the policy: release when the daemon has been quiet
// (little allocated, little CPU) for releaseQuietTicks, there is enough to reclaim, the operator has not
// turned the GC off, and the last release is an interval ago.
func (r *memReleaser) step(now time.Time) {
	s := r.read()
	if s.allocs-r.prev.allocs < releaseQuietBytes && s.cpu-r.prev.cpu < releaseQuietCPU {
		r.quiet++
	} else {
		r.quiet = 0
	}
	r.prev = s
	if r.quiet < releaseQuietTicks || s.gcOff || !s.worthReleasing() ||
		(!r.last.IsZero() && now.Sub(r.last) < r.interval) {
		return
	}
	r.release()
	after := r.read()
	r.prev, r.last = after, now
	var returned uint64
	if after.released > s.released {
		returned = after.released - s.released
	}
	r.stats.releases.Add(1)
	r.stats.lastBytes.Store(returned)
	r.stats.lastUnix.Store(now.UnixNano())
	r.log.Debug("returned freed memory to the OS", "released_bytes", returned,
		"live_bytes", after.live, "reclaimable_bytes", s.reclaimable(), "scope", "gc")
}

// StartMemoryRelease runs the daemon's memory releaser until ctx ends,
// unless cfg.MemoryReleaseInterval is 0, and points cfg.MemoryRelease at
// its stats for /config_dump. It is the process's, like TuneGC: call it
// once, before Start.
func StartMemoryRelease(ctx context.Context, cfg *Config, log *slog.Logger) {
	if cfg.MemoryReleaseInterval <= 0 {
		return
	}
	cfg.MemoryRelease = &MemoryReleaseStats{}
	go newMemReleaser(cfg.MemoryReleaseInterval, cfg.MemoryRelease, log).run(ctx)
}
