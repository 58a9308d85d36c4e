// Package admin serves the daemon's operator endpoints in ztunnel's shapes:
// the admin API on localhost:15000 (/config_dump, /quitquitquit, pprof) and
// readiness on 15021 (/healthz/ready).
//
// Imported by cmd (through internal/app); imports state and mtls.
package admin
