package report

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/google/pprof/profile"
)

// ProfileSummary is what REPORT.md shows of a CPU profile.
type ProfileSummary struct {
	// Seconds is the profiled wall time; CPUSeconds the CPU it recorded.
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpu_seconds"`
	// Flat and Cum are the top functions by self and by cumulative time.
	Flat []FuncShare `json:"flat"`
	Cum  []FuncShare `json:"cum"`
	// Categories split the CPU by what it was spent on; shares sum to 1.
	Categories []FuncShare `json:"categories"`
	// Syscalls splits the syscalls category by the function that made the
	// call (syscall.write, internal/poll.splice, ...); shares are of the
	// whole profile.
	Syscalls []FuncShare `json:"syscalls"`
}

// Cores is the average CPU use while profiled.
func (s ProfileSummary) Cores() float64 {
	if s.Seconds <= 0 {
		return 0
	}
	return s.CPUSeconds / s.Seconds
}

// FuncShare is a function's (or category's) CPU time and share of the total.
type FuncShare struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	Share   float64 `json:"share"`
}

// Category names, in the order they are tested: a sample belongs to the
// first category any frame of its stack matches.
const (
	CatGC         = "GC"
	CatScheduling = "runtime scheduling"
	CatSyscall    = "syscalls"
	CatCrypto     = "crypto"
	CatMemory     = "memmove/alloc"
	CatOther      = "other (proxy code, HTTP/2, ...)"
)

// categoryRules classify a stack. The GC and scheduler run their own
// syscalls (futex, epoll_wait), which are theirs, not the data path's: so
// they are tested first. A syscall is attributed by its frame wherever it is
// called from; crypto and copies come after.
var categoryRules = []struct {
	name  string
	match func(fn string) bool
}{
	{CatGC, func(fn string) bool {
		return hasAnyPrefix(fn, "runtime.gcBgMarkWorker", "runtime.gcAssistAlloc", "runtime.bgsweep", "runtime.bgscavenge",
			"runtime.gcDrain", "runtime.markroot", "runtime.scanobject", "runtime.sweepone", "runtime.gcStart", "runtime.gcMarkDone",
			"runtime.(*gcWork)", "runtime.wbBufFlush", "runtime.greyobject")
	}},
	{CatScheduling, func(fn string) bool {
		return hasAnyPrefix(fn, "runtime.schedule", "runtime.findRunnable", "runtime.park_m", "runtime.goschedImpl",
			"runtime.netpoll", "runtime.futexsleep", "runtime.futexwakeup", "runtime.wakep", "runtime.startm", "runtime.stopm",
			"runtime.notesleep", "runtime.notewakeup", "runtime.sysmon", "runtime.mPark", "runtime.ready", "runtime.goready",
			"runtime.exitsyscall", "runtime.entersyscall", "runtime.casgstatus", "runtime.runqgrab", "runtime.runqsteal",
			"runtime.usleep", "runtime.osyield", "runtime.resetspinning", "runtime.injectglist", "runtime.gopark",
			"runtime.checkTimers", "runtime.(*timers)")
	}},
	{CatSyscall, func(fn string) bool {
		return hasAnyPrefix(fn, "syscall.Syscall", "syscall.RawSyscall", "syscall.syscall", "syscall.rawSyscall",
			"syscall.rawVforkSyscall", "internal/runtime/syscall.", "internal/runtime/syscall/", "runtime/internal/syscall.", "golang.org/x/sys/unix.Syscall",
			"golang.org/x/sys/unix.RawSyscall", "runtime.write1", "runtime.read")
	}},
	{CatCrypto, func(fn string) bool {
		return hasAnyPrefix(fn, "crypto/", "vendor/golang.org/x/crypto/", "golang.org/x/crypto/")
	}},
	{CatMemory, func(fn string) bool {
		return hasAnyPrefix(fn, "runtime.memmove", "runtime.mallocgc", "runtime.memclrNoHeapPointers", "runtime.growslice",
			"runtime.newobject", "runtime.makeslice", "runtime.(*mcache)", "runtime.(*mcentral)", "runtime.(*mheap)",
			"runtime.nextFreeFast", "runtime.heapSetType", "runtime.publicationBarrier")
	}},
}

func hasAnyPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// SummarizeProfile computes the top functions and the category shares of a
// CPU profile (the "cpu" sample type, nanoseconds).
func SummarizeProfile(p *profile.Profile, top int) (ProfileSummary, error) {
	vi := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			vi = i
		}
	}
	if vi < 0 {
		return ProfileSummary{}, errors.New("report: not a CPU profile (no cpu/nanoseconds sample type)")
	}
	sum := ProfileSummary{Seconds: float64(p.DurationNanos) / 1e9}
	flat := map[string]int64{}
	cum := map[string]int64{}
	cats := map[string]int64{}
	calls := map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		v := s.Value[vi]
		total += v
		// Frames leaf first; inlined frames come before their caller.
		var frames []string
		for _, loc := range s.Location {
			for _, ln := range loc.Line {
				if ln.Function != nil {
					frames = append(frames, ln.Function.Name)
				}
			}
		}
		if len(frames) == 0 {
			flat["(unknown)"] += v
			cum["(unknown)"] += v
			cats[CatOther] += v
			continue
		}
		flat[frames[0]] += v
		seen := map[string]bool{}
		for _, f := range frames {
			if !seen[f] {
				seen[f] = true
				cum[f] += v
			}
		}
		cat := categorize(frames)
		cats[cat] += v
		if cat == CatSyscall {
			calls[syscallCaller(frames)] += v
		}
	}
	sum.CPUSeconds = float64(total) / 1e9
	sum.Flat = topN(flat, total, top)
	sum.Cum = topN(cum, total, top)
	for _, r := range categoryRules {
		sum.Categories = append(sum.Categories, share(r.name, cats[r.name], total))
	}
	sum.Categories = append(sum.Categories, share(CatOther, cats[CatOther], total))
	sum.Syscalls = topN(calls, total, top)
	return sum, nil
}

// syscallCaller names a syscall by the first frame above the generic
// syscall machinery: syscall.write, internal/poll.splice, ...
func syscallCaller(frames []string) string {
	for _, f := range frames {
		if !hasAnyPrefix(f, "internal/runtime/syscall.", "internal/runtime/syscall/", "runtime/internal/syscall.",
			"syscall.Syscall", "syscall.RawSyscall", "syscall.syscall", "syscall.rawSyscall", "syscall.rawVforkSyscall",
			"golang.org/x/sys/unix.Syscall", "golang.org/x/sys/unix.RawSyscall", "golang.org/x/sys/unix.syscall",
			"runtime.entersyscall", "runtime.exitsyscall") {
			return f
		}
	}
	return frames[len(frames)-1]
}

func categorize(frames []string) string {
	for _, r := range categoryRules {
		for _, f := range frames {
			if r.match(f) {
				return r.name
			}
		}
	}
	return CatOther
}

func share(name string, v, total int64) FuncShare {
	fs := FuncShare{Name: name, Seconds: float64(v) / 1e9}
	if total > 0 {
		fs.Share = float64(v) / float64(total)
	}
	return fs
}

func topN(m map[string]int64, total int64, n int) []FuncShare {
	out := make([]FuncShare, 0, len(m))
	for k, v := range m {
		out = append(out, share(k, v, total))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Seconds != out[j].Seconds {
			return out[i].Seconds > out[j].Seconds
		}
		return out[i].Name < out[j].Name
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// CategoryShare returns the share of the named category, or 0.
func (s ProfileSummary) CategoryShare(name string) float64 {
	for _, c := range s.Categories {
		if c.Name == name {
			return c.Share
		}
	}
	return 0
}

// String is a one-line digest, for logs.
func (s ProfileSummary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%.2f cores:", s.Cores())
	for _, c := range s.Categories {
		fmt.Fprintf(&b, " %s %.0f%%", c.Name, 100*c.Share)
	}
	return b.String()
}

// HeapSummary is what REPORT.md shows of a heap profile taken while idle
// connections were held: where the live memory was allocated.
type HeapSummary struct {
	// InuseKiB is the live heap the profile accounts for.
	InuseKiB float64 `json:"inuse_kib"`
	// Flat and Cum are the top allocation sites by live bytes: the
	// allocating function, and every function on the allocating stacks.
	Flat []SiteShare `json:"flat"`
	Cum  []SiteShare `json:"cum"`
}

// SiteShare is the live heap allocated under one function.
type SiteShare struct {
	Name  string  `json:"name"`
	KiB   float64 `json:"kib"`
	Share float64 `json:"share"`
}

// SummarizeHeap ranks the allocation sites of a heap profile by live bytes
// (the "inuse_space" sample type).
func SummarizeHeap(p *profile.Profile, top int) (HeapSummary, error) {
	vi := -1
	for i, st := range p.SampleType {
		if st.Type == "inuse_space" {
			vi = i
		}
	}
	if vi < 0 {
		return HeapSummary{}, errors.New("report: not a heap profile (no inuse_space sample type)")
	}
	flat := map[string]int64{}
	cum := map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		v := s.Value[vi]
		total += v
		seen := map[string]bool{}
		first := true
		for _, loc := range s.Location {
			for _, ln := range loc.Line {
				if ln.Function == nil {
					continue
				}
				name := ln.Function.Name
				if first && !hasAnyPrefix(name, "runtime.mallocgc", "runtime.newobject", "runtime.makeslice",
					"runtime.growslice", "runtime.makemap", "runtime.rawstring", "runtime.rawbyteslice") {
					// The allocation site is the first frame above the
					// allocator itself.
					flat[name] += v
					first = false
				}
				if !seen[name] {
					seen[name] = true
					cum[name] += v
				}
			}
		}
	}
	sum := HeapSummary{InuseKiB: float64(total) / 1024}
	conv := func(fs []FuncShare) []SiteShare {
		out := make([]SiteShare, len(fs))
		for i, f := range fs {
			// topN works in nanoseconds; here the unit is bytes.
			out[i] = SiteShare{Name: f.Name, KiB: f.Seconds * 1e9 / 1024, Share: f.Share}
		}
		return out
	}
	sum.Flat = conv(topN(flat, total, top))
	sum.Cum = conv(topN(cum, total, top))
	return sum, nil
}
