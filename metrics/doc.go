// Package metrics holds the daemon's Prometheus metric families under
// Istio's names, types and label sets (istio_tcp_*, istio_xds_*, istio_dns_*,
// workload_manager_*, istio_build, process_*), so that Kiali, Istio's
// dashboards and existing alerts work unchanged when the binary is swapped.
// Every family has a feeder on the daemon's path: the xDS client's
// callbacks feed istio_xds_*, the CRL checks istio_crl_policy_rejections_total
// and istio_crl_load_failures_total, the admin package's servers (through
// internal/app) ztunnel_go_admin_connections_refused_total and the proxies'
// descriptor budget ztunnel_go_fd_budget_refusals_total, two families of
// our own. istio_crl_untracked_connections_total is registered for
// ztunnel's label set and stays at zero: every open connection is
// re-checked in place on a CRL reload, none goes untracked.
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
