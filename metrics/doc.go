// Package metrics holds the daemon's Prometheus metric families under
// Istio's names, types and label sets (istio_tcp_*, istio_xds_*, istio_dns_*,
// workload_manager_*, istio_build, process_*), so that Kiali, Istio's
// dashboards and existing alerts work unchanged when the binary is swapped.
// Not all are fed yet: nothing calls XDSMessage or XDSConnectionTerminated
// (the xDS client records nothing), nor CRLRejected and CRLUntracked (no
// revocation lists), so the istio_xds_* and istio_crl_* families stay at
// zero and the dashboards' xDS panels show nothing.
//
// The traffic families are fed without a lock or a label lookup per read:
// a connection registers its byte counters once, at open (ConnOpened), and
// a scrape sums the counters of open connections with the totals of closed
// ones. Everything else is a plain client_golang vector.
//
// A leaf: it imports only the Prometheus client and the standard library.
// Imports (of ours): nothing of ours. Imported by: dnsproxy, inpod,
// internal/app (which serves Gatherer on 15020 through admin), proxy and
// tests.
package metrics
