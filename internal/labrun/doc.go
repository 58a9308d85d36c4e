// Package labrun runs ztunnel-go daemons and test applications inside a
// netnslab topology: it writes the shared CA and the local config, starts one
// daemon per meshed pod (dedicated mode for now, one daemon per node once
// in-pod mode lands), waits for readiness, and runs echo servers whose
// accepted peers can be inspected. The end-to-end tests and the demo share it.
//
// Imported by e2e tests and cmd/zlab only.
package labrun
