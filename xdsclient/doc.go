// Package xdsclient is a generic delta ADS client
// (envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources)
// that behaves on the wire as ztunnel's: one wildcard (or on-demand)
// subscription per registered type URL, the node ID and metadata ztunnel sends,
// ACKs and NACKs whose error_detail names each rejected resource, partial
// apply, reconnection with backoff that resumes from the versions it holds,
// on-demand lookups, and a Synced signal once the first response of every
// type has been ACKed.
//
// It knows nothing of workloads: Handlers registered per type URL receive the
// raw resources (google.protobuf.Any) and removals and say which they
// rejected. state/xdsconv provides the handlers for Istio's Address and
// Authorization types; the daemon wires the two together.
//
// Imports (of ours): controlplane. Imported by: internal/app,
// state/xdsconv and tests.
package xdsclient
