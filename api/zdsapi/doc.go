// Package zdsapi holds the Go types of ZDS (istio.workload.zds), the protocol
// between the Istio CNI agent and the node proxy, generated from
// proto/zds.proto by `make generate`; only this doc file is written by hand.
//
// Imports (of ours): nothing of ours. Imported by: inpod (the in-pod workload
// manager of shared mode), inpod/zdstest and tests.
package zdsapi
