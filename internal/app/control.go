package app

import (
	"context"
	"fmt"
	"log/slog"
)

// xdsLogf logs the xDS client's events under scope "xds" at the levels it
// gives them (ztunnel's: connection errors warn, NACKs error).
func xdsLogf(log *slog.Logger) func(slog.Level, string, ...any) {
	return func(l slog.Level, f string, a ...any) {
		log.Log(context.Background(), l, fmt.Sprintf(f, a...), "scope", "xds")
	}
}
