package proxy

import (
	"context"
	"log/slog"
	"time"
)

// accessLog collects one connection's log fields in ztunnel's names
// (src.addr, dst.workload, direction, bytes_sent, ...).
type accessLog struct {
	start time.Time
	attrs []slog.Attr
}

func newAccessLog(direction string) *accessLog {
	l := &accessLog{start: time.Now()}
	l.attrs = append(l.attrs, slog.String("direction", direction))
	return l
}

func (l *accessLog) add(key, value string) {
	if value != "" {
		l.attrs = append(l.attrs, slog.String(key, value))
	}
}

// complete writes "connection complete" (INFO) or, with an error, at ERROR.
// sent and recv are from the point of view of the connection's source.
func (l *accessLog) complete(log *slog.Logger, sent, recv int64, err error) {
	attrs := append(l.attrs,
		slog.Int64("bytes_sent", sent),
		slog.Int64("bytes_recv", recv),
		slog.String("duration", time.Since(l.start).Round(time.Millisecond).String()))
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelError
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	log.LogAttrs(context.Background(), level, "connection complete", append(attrs, slog.String("scope", "access"))...)
}

// failed writes "connection failed" (WARN) for connections that never got a
// route.
func (l *accessLog) failed(log *slog.Logger, err error) {
	log.LogAttrs(context.Background(), slog.LevelWarn, "connection failed",
		append(l.attrs, slog.String("error", err.Error()), slog.String("scope", "access"))...)
}
