package proxy

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// testBackends are the engine backends the proxy's byte-carrying rig tests
// run on: the proxy hands every relay to the engine, and each backend
// relays (and ends, and reports) them its own way. backendEpollLoop is
// epoll with the HBONE connections owned by its loops too and the loops
// blocking in epoll_wait (LoopDrive, BlockStreamLoops: the daemon's
// default); backendEpoll is the goroutine-driven HBONE path with parking
// loops (ZTUNNEL_ENGINE_STREAM_WAIT=park; the daemon's HBONE connections
// that no loop can own, as crypto/tls ones, take it).
var testBackends = []string{engine.BackendStd, engine.BackendEpoll, backendEpollLoop, engine.BackendUring}

const backendEpollLoop = "epoll+loop"

// loopEngines holds the engines onEachBackend made for backendEpollLoop:
// withEngine gives their proxies LoopDrive.
var loopEngines sync.Map // *engine.Engine -> struct{}

// onEachBackend runs fn as a subtest per backend, with an engine of that
// backend for the rig's proxies (withEngine). Where the kernel refuses
// io_uring (EPERM, ENOSYS, EACCES: a seccomp filter, an old kernel, a
// sysctl) the uring subtest is skipped through netnslab.Skip, which counts
// it. The engine is closed after the subtest's own cleanups, so after the
// proxies that use it.
func onEachBackend(t *testing.T, fn func(t *testing.T, eng *engine.Engine)) {
	t.Helper()
	for _, name := range testBackends {
		t.Run(name, func(t *testing.T) {
			backend := name
			if name == backendEpollLoop {
				backend = engine.BackendEpoll
			}
			// The loop-owned backend is the daemon's default: its stream
			// loops block in epoll_wait (ZTUNNEL_ENGINE_STREAM_WAIT=block).
			eng, err := engine.New(engine.Config{Backend: backend, BlockStreamLoops: name == backendEpollLoop})
			if err != nil {
				if name == engine.BackendUring && kernelRefused(err) {
					netnslab.Skip(t, fmt.Sprintf("the kernel refuses io_uring: %v", err))
				}
				t.Fatal(err)
			}
			t.Cleanup(func() { eng.Close() })
			if name == backendEpollLoop {
				loopEngines.Store(eng, struct{}{})
				t.Cleanup(func() { loopEngines.Delete(eng) })
			}
			fn(t, eng)
		})
	}
}

// kernelRefused reports whether err is the kernel refusing a backend's
// set-up (how engine.New reports a backend the machine does not allow).
func kernelRefused(err error) bool {
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EACCES)
}

// withEngine is the Config option that runs a rig proxy's relays on eng.
func withEngine(eng *engine.Engine) func(*Config) {
	return func(c *Config) {
		c.Engine = eng
		if _, ok := loopEngines.Load(eng); ok {
			c.HBONE.Drive = LoopDrive(eng)
		}
	}
}
