package app

import (
	"fmt"
	"log/slog"

	"github.com/ztunnel-go/ztunnel/admin"
	"github.com/ztunnel-go/ztunnel/engine"
)

// newEngine makes the daemon's relay engine, the one every proxy relays
// on (the in-pod manager's per-pod proxies included), from ZTUNNEL_ENGINE.
// A backend the kernel refuses falls back to the best one it allows; the
// fallback is logged here. The daemon closes the engine after its proxies
// (Drain, Close).
func newEngine(cfg *Config, log *slog.Logger) (*engine.Engine, error) {
	e, err := engine.New(engine.Config{
		Backend:          cfg.Engine,
		Fallback:         true,
		BlockStreamLoops: cfg.EngineStreamWait == "block",
		Logf:             func(f string, a ...any) { log.Warn(fmt.Sprintf(f, a...), "scope", "engine") },
	})
	if err != nil {
		return nil, err
	}
	if why := e.Fallback(); why != nil {
		log.Warn("relay engine fallback", "asked", cfg.Engine, "backend", e.Backend(), "reason", why.Error(), "scope", "engine")
	}
	return e, nil
}

// engineDump is the engine's section of /config_dump.
func engineDump(e *engine.Engine) admin.EngineDump {
	st := e.Stats()
	d := admin.EngineDump{
		Backend: st.Backend, Loops: st.Loops, StreamLoops: st.StreamLoops, Running: st.Running,
		Relays: st.Relays, LoopRelays: st.LoopRelays,
		PipesInUse: st.PipesInUse, PipesFree: st.PipesFree, StreamBuffers: st.StreamBuffers,
		Conns: st.Conns, ConnStalls: st.ConnStalls, LocalWakes: st.LocalWakes,
	}
	if why := e.Fallback(); why != nil {
		d.Fallback = why.Error()
	}
	return d
}
