// Package logging writes the daemon's logs the way ztunnel writes them, so
// that log pipelines and habits carry over when the binary is swapped: a
// log/slog handler for ztunnel's plain format
//
//	2026-01-02T15:04:05.123456Z	info	access	connection complete	src.addr=10.0.0.1:4242 dst.workload="b" bytes_sent=82
//
// and its JSON format (LOG_FORMAT=json; keys level, time, scope, message,
// then the fields); per-scope levels in RUST_LOG syntax ("info,access=debug")
// that the admin /logging endpoint changes while the daemon runs (Levels).
//
// A record's scope (ztunnel's tracing target: "access" for access logs) is
// its "scope" attribute, given per record or, cheaper, once with
// logger.With("scope", name). Records without one get Options.DefaultScope.
//
// Imports (of ours): nothing of ours. Imported by: internal/app (which builds
// the daemon's logger and hands Levels to admin) and tests. The packages that
// log take a *slog.Logger.
package logging
