package app

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
)

// parseLogLevel accepts the common subset of RUST_LOG: a bare level, or
// comma-separated "target=level" directives, of which the bare default
// level decides (per-scope levels arrive with the operations issue).
func parseLogLevel(s string) (slog.Level, error) {
	level := slog.LevelInfo
	for _, d := range strings.Split(s, ",") {
		d = strings.TrimSpace(d)
		if d == "" {
			continue
		}
		target, lvl, scoped := strings.Cut(d, "=")
		if !scoped {
			lvl = target
		}
		l, err := levelOf(lvl)
		if err != nil {
			return 0, err
		}
		if !scoped {
			level = l
		}
	}
	return level, nil
}

func levelOf(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "trace", "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error", "off":
		return slog.LevelError, nil
	}
	return 0, errors.New("want a level: trace, debug, info, warn, error or off")
}

// newLogger builds the daemon's logger in plain (key=value) or JSON format.
func newLogger(w io.Writer, format, level string) *slog.Logger {
	lvl, _ := parseLogLevel(level)
	opts := &slog.HandlerOptions{Level: lvl}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func splitHostPort(addr string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return "", "", errors.New("want host:port")
	}
	return host, port, nil
}
