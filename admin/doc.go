// Package admin serves the daemon's operator endpoints in ztunnel's shapes:
// the admin API on localhost:15000 (/config_dump, /logging, /quitquitquit,
// pprof), the metrics server on 15020 (/metrics, /stats/prometheus, from
// any Prometheus Gatherer, compressed as asked) and readiness on 15021
// (/healthz/ready).
//
// Imports (of ours): mtls and state. Imported by: internal/app. The log filter
// and the metrics come in through interfaces (LogLevels, prometheus.Gatherer),
// so it needs neither internal/logging nor metrics.
package admin
