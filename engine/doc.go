// Package engine owns the sockets of the data path: listeners with the options
// a node proxy needs (SO_ORIGINAL_DST, IP_TRANSPARENT, SO_MARK, SO_REUSEPORT,
// keepalive, TCP_NODELAY), dialers that originate connections on behalf of a
// pod, and the relays that move bytes once the proxy has decided a route.
//
// Control in goroutines, data in the engine: the proxy decides a connection's
// route in straight-line Go, then hands both ends to an Engine and forgets
// them. An Engine is a value its owner makes with New and closes (or
// drains) when its users are done: the daemon (internal/app) makes one and
// hands it to every proxy. The package keeps no state of its own.
//
// A relay has one way in, Engine.Start (StartDial is Start with the connect
// to the B side left to the engine; a whole multiplexed connection goes in
// through TakeConn, below), in one dispatch order (start.go):
// between two TCP sockets an event-loop backend takes the sockets over and
// moves bytes with splice(2) through pooled pipes (epoll copies small
// messages through one buffer per loop, and splices once a flow is bulk):
// an idle relay then holds no goroutine, no buffer and no pipe, only a few
// hundred bytes of state in its loop. StartDial also leaves the connect to
// the destination to the loop, so a passthrough upstream never passes
// through the runtime's poller. A TCP socket paired with an HBONE stream (a
// StreamEndpoint, see stream.go) is relayed by the epoll loops too: the
// socket is polled, the stream wakes the loop, and an idle relay holds no
// goroutine and no buffer. Other pairs, and streams on the std and uring
// backends, are relayed by two goroutines (std.go). A relay is reset from
// outside through the Handle Start returns.
//
// A multiplexed connection (a pooled HBONE connection) can be handed to
// an epoll stream loop as a whole with TakeConn (conn.go, conn_linux.go):
// the loop owns its socket's readiness, flush and close while a
// ConnDriver (the protocol, outside this package) does the I/O, and the
// relays of its streams (Homed) are placed on the same loop, so a round
// trip crosses no goroutine. The std and uring backends answer
// ErrUnsupported and the caller keeps its goroutines.
//
// Backends, chosen by Config.Backend (the daemon's ZTUNNEL_ENGINE):
//
//   - auto (default): the fastest the kernel allows, by measurement: epoll
//     today (see autoOrder in engine.go), io_uring where epoll is missing;
//   - epoll (epoll_*.go): event loops on epoll (engine/poll), one per core
//     for TCP⇄TCP relays, each a goroutine blocked in epoll_wait while it
//     has relays (parked in the netpoller while it lingers), and one
//     per core for TCP⇄stream relays, each parked in the runtime's
//     netpoller when idle (with Config.LockOSThread, all on locked OS
//     threads in epoll_wait);
//   - uring (uring_*.go): event loops on io_uring (engine/uring), one per
//     core, each on a locked OS thread; a kernel that refuses io_uring
//     (seccomp, io_uring_disabled) makes auto, and uring with
//     Config.Fallback, fall back to epoll (Engine.Fallback says why);
//   - std (std.go): a goroutine per direction with io.Copy, the portable
//     baseline kept for comparison.
//
// The two event-loop backends share their loop core (loopcore_linux.go:
// task queue, slot table, idle list, clock, pipe pool). Engine.Backend names the
// backend in use and Engine.Stats its load, for logs and /config_dump.
//
// Sockets that are idle nearly always (a node's pods' listeners, their DNS
// proxies' sockets) can wait on the engine's watcher instead of a goroutine
// each (WatchReadable, watch_linux.go): one goroutine, one epoll set,
// level-triggered and one-shot; it runs the socket's ready function, which
// takes what is ready without blocking, and arms the socket again.
//
// Imports (of ours): engine/bufpool, engine/poll, engine/splice and
// engine/uring (no TLS, no HTTP/2: streams reach it through the small
// interfaces in relay.go, stream.go and conn.go). Imported by: engine/enginetest,
// internal/app, proxy and tests.
package engine
