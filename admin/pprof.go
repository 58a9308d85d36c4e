package admin

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"runtime"
	"strconv"
	"sync"
)

// Contention sampling rates while /debug/pprof/contention is active: one
// mutex contention event in 100, blocking events of 10µs and more.
const (
	mutexProfileFraction = 100
	blockProfileRate     = 10_000 // ns
)

func (s *Server) routePprof() {
	// Index also serves the named profiles: heap, goroutine, allocs,
	// threadcreate, mutex, block.
	s.mux.HandleFunc("/debug/pprof/", pprof.Index)
	s.mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	s.mux.HandleFunc("/debug/pprof/profile", cpuProfile)
	s.mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	s.mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.mux.HandleFunc("/debug/pprof/contention", s.contention)
	s.mux.HandleFunc("/debug/pprof/heap/profiling", heapProfiling)
}

// heapProfiling is ztunnel's /debug/pprof/heap/profiling (query or toggle
// jemalloc's heap sampling with ?activate=true|false). Go samples the heap
// from the start at runtime.MemProfileRate, which may only be set before
// the first allocation, so it is always active: activate=true is
// accepted, false refused with a reason.
func heapProfiling(w http.ResponseWriter, r *http.Request) {
	switch v, ok := r.URL.Query()["activate"]; {
	case !ok || v[0] == "true":
	case v[0] == "false":
		plain(w, http.StatusBadRequest, "heap profiling cannot be deactivated: the Go runtime samples the heap from the start\n")
		return
	default:
		plain(w, http.StatusBadRequest, fmt.Sprintf("invalid activate value %q; expected true or false\n", v[0]))
		return
	}
	plain(w, http.StatusOK, fmt.Sprintf("heap profiling active: %v\n", runtime.MemProfileRate > 0))
}

// cpuProfile applies ztunnel's parameter rules to Go's CPU profile:
// seconds 1-300 (default 10 rather than Go's 30), frequency 1-1000 Hz.
// The Go profiler samples at 100 Hz whatever frequency says.
func cpuProfile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if v := q.Get("seconds"); v != "" {
		if n, err := strconv.ParseUint(v, 10, 64); err != nil || n < 1 || n > 300 {
			plain(w, http.StatusBadRequest, "invalid seconds value; expected 1-300\n")
			return
		}
	} else {
		q.Set("seconds", "10")
		r.URL.RawQuery = q.Encode()
	}
	if v := q.Get("frequency"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 32); err != nil || n < 1 || n > 1000 {
			plain(w, http.StatusBadRequest, "invalid frequency value; expected 1-1000\n")
			return
		}
	}
	pprof.Profile(w, r)
}

// contentionMu serializes changes of the process-wide sampling rates.
var contentionMu sync.Mutex

// contention turns the mutex and block profiles on (?activate=true) or
// off (?activate=false); they are empty until turned on, and sampling has
// a cost, so it is off by default. Any method shows the state; only POST
// changes it.
func (s *Server) contention(w http.ResponseWriter, r *http.Request) {
	contentionMu.Lock()
	defer contentionMu.Unlock()
	if v := r.URL.Query().Get("activate"); v != "" {
		if r.Method != http.MethodPost {
			http.Error(w, "use POST to change profiling", http.StatusMethodNotAllowed)
			return
		}
		on, err := strconv.ParseBool(v)
		if err != nil {
			http.Error(w, "activate must be true or false", http.StatusBadRequest)
			return
		}
		if on {
			runtime.SetMutexProfileFraction(mutexProfileFraction)
			runtime.SetBlockProfileRate(blockProfileRate)
		} else {
			runtime.SetMutexProfileFraction(0)
			runtime.SetBlockProfileRate(0)
		}
		s.cfg.Logger.Info("contention profiling changed", "active", on, "scope", "admin")
	}
	// SetMutexProfileFraction with a negative rate reads without changing.
	if f := runtime.SetMutexProfileFraction(-1); f > 0 {
		plain(w, http.StatusOK, fmt.Sprintf("contention profiling is active: mutex fraction %d, block events of %dns and more\n", f, blockProfileRate))
		return
	}
	plain(w, http.StatusOK, "contention profiling is inactive; POST ?activate=true to sample /debug/pprof/mutex and /debug/pprof/block\n")
}
