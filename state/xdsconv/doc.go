// Package xdsconv is the only bridge from external formats to package state:
// it turns ztunnel's local config YAML (LOCAL_XDS_PATH / LOCAL_XDS) into state
// values, checking every field against ztunnel's schema with errors that name
// the line and the field. The xDS resource converter (istio.workload.Address,
// istio.security.Authorization) will live here too.
//
// Only the daemon's control plane (cmd/ztunnel and the xDS client wiring)
// imports it; the data path sees nothing but state.
package xdsconv
