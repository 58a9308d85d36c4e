// Package engine owns the sockets of the data path: listeners with the options
// a node proxy needs (SO_ORIGINAL_DST, IP_TRANSPARENT, SO_MARK, SO_REUSEPORT,
// keepalive, TCP_NODELAY), dialers that originate connections on behalf of a
// pod, and the relays that move bytes once the proxy has decided a route.
//
// Control in goroutines, data in the engine: the proxy decides a connection's
// route in straight-line Go, then hands both ends to Relay and forgets them.
// This first engine relays with one goroutine per direction (io.Copy, which
// splices TCP to TCP); the event-loop backends (epoll, io_uring) replace that
// behind the same Relay seam without the proxy changing.
//
// Imported by proxy, inpod and cmd; it imports no other package of this
// module (no TLS, no HTTP/2: streams reach it through the small interfaces in
// relay.go).
package engine
