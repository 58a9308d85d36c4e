// Package xdsconv is the only bridge from external formats to package state.
// It has one job, turning configuration into state values and snapshots, fed
// from two sources:
//
//   - ztunnel's local config YAML (LOCAL_XDS_PATH / LOCAL_XDS): ParseLocalConfig
//     checks every field against ztunnel's schema with errors that name the
//     line and the field;
//   - istiod's xDS resources (istio.workload.Address and
//     istio.security.Authorization): ConvertAddress and ConvertAuthorization
//     validate and convert them, and XDSState's handlers (which plug into
//     xdsclient) apply each push's converted resources to a state.Writer,
//     which holds them on top of an optional local config and publishes the
//     next snapshot, and name the rejected resources in the ACK or NACK.
//
// Conversion holds once what repeats across workloads (intern.go): names
// through a weak table of their bytes (which keeps a name while any value
// holds it), and the replicas' identical Labels, Extra and Services (and
// services' identical port maps) through weak caches, so that a large mesh
// costs little more than each workload's own record, uid and addresses.
//
// Imports (of ours): api/securityapi, api/workloadapi (the generated protos),
// identity, state and xdsclient (for the handler types only). Imported by:
// internal/app (the daemon's control-plane wiring), internal/labrun and tests.
// The data path sees nothing but state.
package xdsconv
