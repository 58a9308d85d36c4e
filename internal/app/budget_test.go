package app

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/fdbudget"
)

// TestNewBudget: ZTUNNEL_FD_BUDGET's three forms make the budget every
// proxy shares, log it, and leave the total in force in the config (for
// /config_dump).
func TestNewBudget(t *testing.T) {
	eng, err := engine.New(engine.Config{Backend: engine.BackendEpoll})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	st := eng.Stats()
	limit := fdbudget.NoFileLimit()
	auto := limit - fdbudget.DefaultReserve(limit, st.Loops+st.StreamLoops)
	for _, tc := range []struct {
		setting string
		total   int // 0: no budget
		log     string
	}{
		{"auto", auto, "total=" + strconv.Itoa(auto)},
		{"off", 0, "descriptor budget off"},
		{"500", 500, "total=500"},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			var logs bytes.Buffer
			cfg := &Config{FDBudget: tc.setting}
			b := newBudget(cfg, eng, slog.New(slog.NewTextHandler(&logs, nil)))
			if b.Total() != tc.total {
				t.Fatalf("total %d, want %d", b.Total(), tc.total)
			}
			want := strconv.Itoa(tc.total)
			if tc.total == 0 {
				want = "off"
			}
			if cfg.FDBudget != want {
				t.Errorf("config says %q, want %q", cfg.FDBudget, want)
			}
			if !strings.Contains(logs.String(), tc.log) {
				t.Errorf("log %q does not say %q", logs.String(), tc.log)
			}
		})
	}
}
