// Package dnsproxy is ztunnel's DNS proxy (port 15053): a small DNS server,
// one per proxied workload and inside its network namespace, that answers
// A and AAAA questions for the mesh's services from the current state
// snapshot and forwards everything else to the node's resolvers.
//
// A name is looked up as ztunnel does: the question itself, its Kubernetes
// expansions for the client's namespace (svc, svc.ns, svc.ns.svc), the
// same after stripping each of the client's search domains, and for each of
// those every wildcard (*.example.com) from the most specific up. Only
// services visible to the client's namespace count; a service in the
// client's namespace wins, then a canonical one. Services with VIPs answer
// with the VIPs on the client's network; Kubernetes headless services
// (no VIP, hostname under svc.<domain>) answer with their endpoints'
// addresses, and <pod>.<service>.<ns>.svc.<domain> with that pod's. A name
// found only after stripping a search domain gets a CNAME to the stripped
// name. Answers have a TTL of 30 s and come in random order; a known name
// without an address of the asked family gets an empty NOERROR, and so does
// every AAAA question for a known name with Config.IPv4Only
// (IPV6_ENABLED=false).
//
// Unknown names and other question types go to the upstream resolvers
// (resolv.conf's, read by the caller with ReadResolvConf, with its timeout
// and attempts) over sockets made by the caller's Dial inside
// Config.Control, so that in shared mode they leave from the pod's
// namespace with the proxy's mark. An upstream reply truncated over UDP is
// asked again over TCP, and cut to the client's own UDP size, as
// ztunnel's resolver does. Their answers are kept for their TTL
// (4096 per proxy, as ztunnel's resolver), and Resolver offers the same
// forwarder and cache for the daemon's on-demand hostname lookups. They are tried in
// order, except that one whose exchanges keep failing is tried after those
// that answer, so that a dead resolver does not hold every forwarded query
// for its timeout.
//
// Work is bounded so that neither one client nor a dead upstream can stop
// the answers. Mesh names are answered from the snapshot before any budget
// is spent, so they are answered while forwarding is saturated. Forwarded
// queries take a slot of a budget with a cap in all (MaxInFlight) and per
// client address (MaxInFlightPerClient); without one, a query is dropped
// over UDP (the client retries) and answered SERVFAIL over TCP, and
// Dropped counts it. TCP connections are capped (MaxTCPConns), but a new
// one is always accepted: it evicts the connection active the longest ago,
// preferring one with no query being answered, so stalled connections
// cannot keep an honest client in the backlog. One connection has at most
// MaxTCPPipeline forwarded queries being answered at once, replied to as
// they finish. Requests and responses have size limits, and every upstream
// exchange and TCP read or write a timeout. Undecodable queries are
// answered FORMERR (or dropped when not even the header is there); the
// server keeps serving.
//
// A goroutine per socket serves UDP and TCP; with Config.Watch (the shared
// mode's, where a node has a DNS proxy per pod) the sockets are taken out of
// Go's poller and wait on the caller's watcher instead (watch.go): a quiet
// proxy then holds no goroutine, no poll descriptor and no buffer.
//
// Imports (of ours): fdbudget, metrics and state. Imported by: internal/app.
package dnsproxy
