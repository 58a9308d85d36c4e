// Package xdsconv is the only bridge from external formats to package state.
// It has one job, turning configuration into state values and snapshots, fed
// from two sources:
//
//   - ztunnel's local config YAML (LOCAL_XDS_PATH / LOCAL_XDS): ParseLocalConfig
//     checks every field against ztunnel's schema with errors that name the
//     line and the field;
//   - istiod's xDS resources (istio.workload.Address and
//     istio.security.Authorization): ConvertAddress and ConvertAuthorization
//     validate and convert them, and XDSState keeps the converted set (on top
//     of an optional local config), builds the next snapshot after every push
//     and publishes it to a state.Store. Its handlers plug into xdsclient.
//
// Imports (of ours): api/securityapi, api/workloadapi (the generated protos),
// identity, state and xdsclient (for the handler types only). Imported by:
// internal/app (the daemon's control-plane wiring), internal/labrun and tests.
// The data path sees nothing but state.
package xdsconv
