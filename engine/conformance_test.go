package engine_test

import (
	"testing"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/engine/enginetest"
)

// TestConformance runs the shared suite on every backend. The io_uring one
// skips, saying why, where the kernel refuses io_uring.
func TestConformance(t *testing.T) {
	for _, name := range []string{engine.BackendStd, engine.BackendEpoll, engine.BackendUring} {
		t.Run(name, func(t *testing.T) {
			probe, err := engine.New(engine.Config{Backend: name})
			if err != nil {
				if name == engine.BackendUring {
					t.Skipf("io_uring backend unavailable here: %v", err)
				}
				t.Fatal(err)
			}
			probe.Close()
			enginetest.Run(t, enginetest.Rig{New: func(t testing.TB) *engine.Engine {
				e, err := engine.New(engine.Config{Backend: name})
				if err != nil {
					t.Fatal(err)
				}
				return e
			}})
		})
	}
}
