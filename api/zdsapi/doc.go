// Package zdsapi holds the Go types of ZDS (istio.workload.zds), the protocol
// between the Istio CNI agent and the node proxy, generated from
// proto/zds.proto by `make generate`; only this doc file is written by hand.
//
// The in-pod (shared mode) workload manager and its test kits import it.
package zdsapi
