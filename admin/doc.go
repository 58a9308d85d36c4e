// Package admin serves the daemon's operator endpoints in ztunnel's shapes:
// the admin API on localhost:15000 (/config_dump, /logging, /quitquitquit,
// pprof), the metrics server on 15020 (/metrics, /stats/prometheus, from
// any Prometheus Gatherer, compressed as asked) and readiness on 15021
// (/healthz/ready). Each server is bounded (Serve, Limits): ztunnel's 2 s head
// timeout and 8 KiB head, idle, read and write-stall timeouts, and connection
// caps per source address and in total, enforced at accept.
//
// Imports (of ours): mtls and state. Imported by: internal/app. The log filter
// and the metrics come in through interfaces (LogLevels, prometheus.Gatherer),
// and refused connections go out through a callback (ServeConfig.OnRefused),
// so it needs neither internal/logging nor metrics.
package admin
