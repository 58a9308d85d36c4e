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
// A record's scope is its "scope" attribute, given per record or, cheaper,
// once with logger.With("scope", name); records without one get
// Options.DefaultScope. It is written and filtered as ztunnel's tracing
// target for the same events (targetOf: "xds" is xds::client, "access" stays
// access), so log alerts and RUST_LOG directives carry over: the plain
// format prints the module path, the JSON format the full target
// (ztunnel::xds::client), as ztunnel's do.
//
// Imports (of ours): nothing of ours. Imported by: internal/app (which builds
// the daemon's logger and hands Levels to admin) and tests. The packages that
// log take a *slog.Logger.
package logging
