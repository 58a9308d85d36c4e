package load_test

import (
	"context"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
)

// TestIdleFinalSettle checks that FinalSettle stretches the pause before
// the last sample only, and never shortens it below Settle.
func TestIdleFinalSettle(t *testing.T) {
	d := dialer(t, load.DialConfig{Target: startServer(t, load.ServerConfig{})})
	ctx := context.Background()
	const settle, final = 10 * time.Millisecond, 150 * time.Millisecond
	start := time.Now()
	res, err := load.Idle(ctx, load.IdleConfig{Dialer: d, Count: 4, Steps: 2, Settle: settle, FinalSettle: final})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < final+2*settle {
		t.Fatalf("idle returned after %v, before its settles (%v) were over", el, final+2*settle)
	}
	want := []time.Duration{settle, settle, final}
	if len(res.Samples) != len(want) {
		t.Fatalf("%d samples, want %d", len(res.Samples), len(want))
	}
	for i, s := range res.Samples {
		if s.Settle != want[i] {
			t.Fatalf("sample %d (%d conns) settled %v, want %v", i, s.Conns, s.Settle, want[i])
		}
	}

	// A final settle shorter than the others is no final settle.
	res, err = load.Idle(ctx, load.IdleConfig{Dialer: d, Count: 2, Settle: settle, FinalSettle: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Samples[len(res.Samples)-1]; s.Settle != settle {
		t.Fatalf("last sample settled %v, want Settle's %v", s.Settle, settle)
	}

	for _, fs := range []time.Duration{-time.Second, 2 * load.MaxDuration} {
		if _, err := load.Idle(ctx, load.IdleConfig{Dialer: d, Count: 1, FinalSettle: fs}); err == nil {
			t.Fatalf("final settle %v was accepted", fs)
		}
	}
}
