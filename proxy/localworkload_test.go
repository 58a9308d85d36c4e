package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

// TestLocalWorkloadWait: a connection waits for the proxy's own workload up
// to LocalWorkloadWait (ztunnel's 5s), and goes on as soon as a push brings
// it. Only timers and the store's channel are involved, so the bubble's
// clock makes both waits exact.
func TestLocalWorkloadWait(t *testing.T) {
	snap, err := xdsconv.LocalSnapshot(fmt.Appendf(nil, srvConfig, "")) // apptunnel_test.go
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		ref := WorkloadRef{Namespace: "ns", Name: "srv", ServiceAccount: "srv"}
		store := state.NewStore(nil)
		rt := newRouter(&Config{Workload: ref, State: store, LocalWorkloadWait: 5 * time.Second})

		start := time.Now()
		_, _, err := rt.localWorkload(context.Background())
		if err == nil || !strings.Contains(err.Error(), "failed to fetch information about local workload ns/srv") {
			t.Fatalf("without the workload: %v, want ztunnel's local workload error", err)
		}
		if waited := time.Since(start); waited != 5*time.Second {
			t.Errorf("gave up after %v, want LocalWorkloadWait (5s)", waited)
		}

		go func() {
			time.Sleep(time.Second)
			store.Publish(snap)
		}()
		start = time.Now()
		w, got, err := rt.localWorkload(context.Background())
		if err != nil || w == nil || w.Name != "srv" || got != snap {
			t.Fatalf("after the push: %v, %v, want srv from the pushed snapshot", w, err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("found after %v, want at the push (1s)", waited)
		}
	})
}
