// Package labrun runs ztunnel-go daemons and test applications inside a
// netnslab topology: it writes the shared CA and the config, starts the
// daemons — one per meshed pod in dedicated mode (StartCluster), or one per
// node in shared in-pod mode with a fake Istio CNI agent handing them the
// pods' network namespaces over ZDS (StartSharedCluster) — waits for
// readiness, and runs echo servers whose accepted peers can be inspected.
// The end-to-end tests and the demo share it.
//
// Imports (of ours): hbone, identity, inpod/zdstest, internal/netnslab,
// internal/nettest, mtls, mtls/caclient, state and state/xdsconv. Imported by: bench/harness, cmd/zlab
// and tests (e2e's, and the proxy's for its east-west gateway).
package labrun
