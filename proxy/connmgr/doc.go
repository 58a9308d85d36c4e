// Package connmgr is the connection manager: it tracks every inbound
// connection the proxy has authorized, with the attributes it was authorized
// with, and when the policies change it re-evaluates them and closes the ones
// the new policies deny, as ztunnel's ConnectionManager and PolicyWatcher do.
//
// Re-checks follow policy changes only. A snapshot's PolicyGeneration says
// whether its policies may differ from another's; a converter that rebuilds
// the snapshot for a workload-only update with Snapshot.WithWorkloads keeps
// the generation, and no re-check happens (ztunnel re-checks only on
// Authorization pushes). A tracked connection is re-evaluated with the
// destination workload it was authorized with, as in ztunnel.
//
// Imports (of ours): state. Imported by: internal/app (to run it), proxy and
// tests.
package connmgr
