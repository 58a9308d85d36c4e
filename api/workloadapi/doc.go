// Package workloadapi holds the Go types of the Istio workload discovery API
// (istio.workload: Address, Workload, Service, ...), generated from
// proto/workload.proto by `make generate`; only this doc file is written by
// hand.
//
// Only state/xdsconv (which turns these messages into state values) and test
// kits import it; the xDS client stays generic and never does.
package workloadapi
