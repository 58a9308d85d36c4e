// Package workloadapi holds the Go types of the Istio workload discovery API
// (istio.workload: Address, Workload, Service, ...), generated from
// proto/workload.proto by `make generate`; only this doc file is written by
// hand.
//
// Imports (of ours): nothing of ours. Imported by: api/securityapi,
// state/xdsconv (which turns these messages into state values) and tests. The
// xDS client stays generic and never imports it.
package workloadapi
