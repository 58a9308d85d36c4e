package app

import (
	"log/slog"
	"strconv"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/fdbudget"
)

// newBudget makes the daemon's descriptor budget from ZTUNNEL_FD_BUDGET,
// the one every proxy (the in-pod manager's per-pod proxies and the
// self-proxy too) takes from: auto is RLIMIT_NOFILE minus
// fdbudget.DefaultReserve for the engine's loops. It logs what it chose
// and leaves it in cfg.FDBudget for /config_dump; nil (off, or a limit it
// cannot read) is unlimited.
func newBudget(cfg *Config, eng *engine.Engine, log *slog.Logger) *fdbudget.Budget {
	var total, limit, reserve int
	switch cfg.FDBudget {
	case "off":
	case "auto":
		if limit = fdbudget.NoFileLimit(); limit > 0 {
			st := eng.Stats()
			reserve = fdbudget.DefaultReserve(limit, st.Loops+st.StreamLoops)
			total = limit - reserve
		}
	default:
		total, _ = strconv.Atoi(cfg.FDBudget) // checked by ParseEnv
	}
	b := fdbudget.New(fdbudget.Config{Total: total})
	if b == nil {
		cfg.FDBudget = "off"
		log.Info("descriptor budget off", "nofile_limit", limit)
		return nil
	}
	cfg.FDBudget = strconv.Itoa(b.Total())
	log.Info("descriptor budget", "total", b.Total(), "floor_per_peer", b.Stats().Floor,
		"nofile_limit", limit, "reserve", reserve)
	return b
}
