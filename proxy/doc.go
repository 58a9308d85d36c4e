// Package proxy makes the per-connection decisions of the node proxy:
// outbound (15001: where is this connection going, over HBONE or plain TCP),
// inbound HBONE (15008: who is calling, may they, where to), and inbound
// passthrough (15006: plaintext into a pod, policy without identity), and
// the optional SOCKS5 listener (15080: the app names its destination, which
// then takes the outbound path). Workloads with a PROXY application tunnel
// get a PROXY v2 header in front of each inbound stream.
//
// Each decision runs once per connection in an ordinary goroutine and ends by
// handing both ends to the engine (Config.Engine, the daemon's one engine:
// Engine.Start, or Engine.StartDial for passthrough, whose upstream connect
// the event loop completes). The proxy reads the workload/policy snapshot
// once per connection and never locks on it.
// With a CRL (Config.CRL) a reload that revokes a peer closes its HBONE
// connections: the proxy's inbound ones, and the pool's through
// CloseRevokedOutbound.
//
// The parts, each with one owner: *Proxy (proxy.go, config.go) owns the
// listeners and their accept workers (a goroutine per listener, or with
// Config.WatchListeners the engine's one watcher for all, watch.go), the
// per-peer limits on 15008, Drain,
// and the four handlers (outbound.go, inbound.go, passthrough.go,
// socks5.go). Every accepted connection and inbound stream takes its
// descriptors from the daemon's budget (Config.Budget, budget.go) for its
// source IP, and the relay's end gives them back. The handlers ask a router (router.go) for the decisions over
// the snapshot: the proxy's own workload and identities, where an outbound
// connection goes (route.go; through a network gateway, gateway.go), who an
// inbound one comes from and what its authority may name (authority.go),
// which address a name means (resolve.go), and on demand what the
// snapshot lacks (ondemand.go); it opens nothing, so its tests call it
// without a proxy. A conn (conn.go) is one connection's record and
// lifecycle: newConn, then fail (no route) or open, relay, end, with
// the connection manager's policy hooks and the /config_dump list. A
// tunnel (tunnel.go) opens an outbound HBONE stream: TLS to the peer's
// 15008 and CONNECT through the pool (open), or double HBONE through a
// network gateway (openInner), pooled by a tunnelKey. Errors carry their
// response flags (flags.go), so a conn ends with one error. stream.go
// adapts an HBONE stream to the engine's stream endpoint. loopconn.go is
// where an HBONE connection's parts meet (as ztunnel's connection
// spawner): the TLS records (mtls/record, imported there alone), the event
// loop that owns the socket (LoopDrive) and hbone; an inbound connection
// on 15008 frees its worker once it runs (hbone.Server.Start), and its end
// gives back what it holds.
//
// Telemetry is ztunnel's: the CONNECT metadata it sends and reads
// (Forwarded host=, baggage), the service attribution of both reporters,
// the metric labels and the access-log fields derived from them
// (telemetry.go), and the open connections Connections lists for the
// config dump.
//
// Imports (of ours): engine, fdbudget, hbone, identity, metrics, mtls,
// mtls/record, proxy/connmgr, proxy/meta, proxy/proxyproto, proxy/socks5
// (its protocol leaves) and state. Imported by: internal/app and tests.
package proxy
