package admin

import (
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Readiness tracks the startup tasks that must finish before the daemon
// reports ready (ztunnel: "state manager", "proxy", "workload proxy manager").
type Readiness struct {
	mu      sync.Mutex // guards the following fields
	pending map[string]int
}

// NewReadiness returns a tracker with no pending task (ready).
func NewReadiness() *Readiness { return &Readiness{pending: make(map[string]int)} }

// Register adds a pending task and returns the function that marks it done.
// Calling done more than once has no further effect.
func (r *Readiness) Register(task string) (done func()) {
	r.mu.Lock()
	r.pending[task]++
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.pending[task]--; r.pending[task] <= 0 {
				delete(r.pending, task)
			}
		})
	}
}

// Pending lists the tasks not done yet, sorted.
func (r *Readiness) Pending() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.pending))
	for t := range r.pending {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// ServeHTTP answers GET /healthz/ready: 200 "ready", or 500 naming the
// pending tasks.
func (r *Readiness) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/healthz/ready" {
		http.NotFound(w, req)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if p := r.Pending(); len(p) > 0 {
		w.WriteHeader(http.StatusInternalServerError)
		w.Write([]byte("not ready, pending: " + strings.Join(p, ", ") + "\n"))
		return
	}
	w.Write([]byte("ready\n"))
}
