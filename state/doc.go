// Package state holds the proxy's view of the mesh: an immutable Snapshot of
// workloads, services and authorization policies, the lookups the data path
// needs (by address, by VIP, by key), endpoint selection, and ztunnel's L4
// authorization (RBAC) semantics.
//
// Routing decisions that need only the snapshot live here, so they can be
// tested without sockets: VIP ranking (client namespace, canonical, preferred
// namespace, visibility, CIDR prefixes), load balancing (capacity weights,
// health policy, STRICT and FAILOVER locality), target ports, waypoint and
// network gateway resolution, the waypoint "sandwich" checks, and the choice
// of a workload's address by family. The proxy package only applies them.
//
// NewSnapshot compiles the policies into a table indexed by scope, namespace,
// key and destination port, so that Authorize visits only the policies of
// the destination's scopes (of a long list, only those that can match the
// destination port) and allocates nothing. A snapshot's PolicyGeneration tells a
// policy change from a workload-only update (Snapshot.WithWorkloads keeps
// it), which is what the connection manager re-checks open connections on.
//
// A Snapshot never changes once built. One writer (Writer: the workloads
// by uid, services by key and policies by resource name, the
// ranking of workloads that claim one address, and a static base) builds the
// next snapshot off the hot path after each Update and publishes it through a
// Store; readers Load the current one once per connection and never lock. Snapshot.Apply derives the next
// snapshot from a Delta (the workloads, services and policies a push adds,
// replaces or removes) at a cost that follows the size of the delta: the
// indexes are hash tables split into small shards (shardmap.go), and a derived
// snapshot clones only the shards and lists the delta touches, sharing the
// rest with the snapshot it comes from.
//
// It imports only the standard library and identity, so that every part of the
// daemon can depend on it; state/xdsconv is the only place where external
// formats (xDS protos, the local YAML) become state values. Imports (of ours):
// identity. Imported by: admin, dnsproxy, internal/app, internal/labrun,
// proxy, proxy/connmgr, state/xdsconv and tests.
package state
