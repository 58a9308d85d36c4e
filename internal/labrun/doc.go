// Package labrun runs ztunnel-go daemons and test applications inside a
// netnslab topology: it writes the shared CA and the config, starts the
// daemons — one per meshed pod in dedicated mode (StartCluster), or one per
// node in shared in-pod mode with a fake Istio CNI agent handing them the
// pods' network namespaces over ZDS (StartSharedCluster) — waits for
// readiness, and runs echo servers whose accepted peers can be inspected.
// The end-to-end tests and the demo share it.
//
// Imported by e2e tests, cmd/zlab and the bench harness, and by the proxy
// tests for its east-west gateway.
package labrun
