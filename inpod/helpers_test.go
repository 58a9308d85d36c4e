package inpod

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/inpod/zdstest"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// requireRoot skips tests that create network namespaces, through the lab's
// Skip so that make test counts them and CI (NETNSLAB_REQUIRE=1) fails them.
func requireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("network-namespace tests do not run with -short")
	}
	if os.Geteuid() != 0 {
		netnslab.Skip(t, fmt.Sprintf("needs root for network namespaces (running as uid %d)", os.Geteuid()))
	}
}

// newNetns creates an empty network namespace and returns an open file on
// it; the namespace lives as long as the file.
func newNetns(t testing.TB) *os.File {
	t.Helper()
	requireRoot(t)
	type res struct {
		f   *os.File
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{err: err}
			return
		}
		defer home.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- res{err: err}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else: exit locked, and the runtime discards the thread
		ch <- res{f, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("new netns: %v", r.err)
	}
	t.Cleanup(func() { r.f.Close() })
	return r.f
}

// nsPath is a path that opens f's namespace again (for the fake agent).
func nsPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// fakeProxy records what the manager does with it.
type fakeProxy struct {
	pod     Pod
	mu      sync.Mutex
	started bool
	ended   chan struct{}
	drained bool // Drain (rather than Close) ended it
}

func (p *fakeProxy) Start(context.Context) error {
	p.mu.Lock()
	p.started = true
	p.mu.Unlock()
	return nil
}

func (p *fakeProxy) Drain(ctx context.Context) {
	p.mu.Lock()
	p.drained = ctx.Err() == nil
	p.mu.Unlock()
	close(p.ended)
}

func (p *fakeProxy) Close() { close(p.ended) }

func (p *fakeProxy) wasStarted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

func (p *fakeProxy) wasDrained() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drained
}

// isEnded reports whether the manager has ended the proxy.
func (p *fakeProxy) isEnded() bool {
	select {
	case <-p.ended:
		return true
	default:
		return false
	}
}

// factory builds fake proxies; fail[uid] makes that many starts fail.
type factory struct {
	mu      sync.Mutex
	proxies []*fakeProxy
	fail    map[string]int
}

func (f *factory) newProxy(pod Pod) (Proxy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail[pod.UID] > 0 {
		f.fail[pod.UID]--
		return nil, errors.New("bind: address already in use")
	}
	p := &fakeProxy{pod: pod, ended: make(chan struct{})}
	f.proxies = append(f.proxies, p)
	return p, nil
}

func (f *factory) failNext(uid string, n int) {
	f.mu.Lock()
	f.fail[uid] = n
	f.mu.Unlock()
}

func (f *factory) all() []*fakeProxy {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeProxy(nil), f.proxies...)
}

// readiness is a minimal admin.Readiness.
type readiness struct {
	mu      sync.Mutex
	pending int
}

func (r *readiness) register(string) func() {
	r.mu.Lock()
	r.pending++
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			r.pending--
			r.mu.Unlock()
		})
	}
}

func (r *readiness) ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending == 0
}

// rig is a manager with fake proxies talking to a manual fake agent.
type rig struct {
	t     *testing.T
	srv   *zdstest.Server
	mgr   *Manager
	fac   *factory
	ready *readiness
}

func newRig(t *testing.T, tweak func(*Config)) *rig {
	t.Helper()
	dir := t.TempDir()
	srv, err := zdstest.Start(zdstest.Config{Path: filepath.Join(dir, "zds.sock"), Manual: true, AckTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, srv: srv, fac: &factory{fail: map[string]int{}}, ready: &readiness{}}
	cfg := Config{UDS: srv.Path(), NewProxy: r.fac.newProxy, Ready: r.ready.register, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	if tweak != nil {
		tweak(&cfg)
	}
	r.mgr, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.mgr.Start()
	t.Cleanup(func() {
		r.mgr.Close()
		srv.Close()
	})
	return r
}

// accept takes the manager's next connection and reads its hello.
func (r *rig) accept() *zdstest.Conn {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := r.srv.Accept(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	v, err := c.Hello()
	if err != nil {
		r.t.Fatal(err)
	}
	if v != 1 {
		r.t.Fatalf("hello version %v, want V1", v)
	}
	return c
}

// eventually polls cond for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !nettest.Until(10*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}
