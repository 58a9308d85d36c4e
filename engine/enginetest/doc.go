// Package enginetest is the conformance suite every relay backend of the
// engine passes (std, epoll, io_uring): echo with checksums, large
// transfers, many concurrent relays, half-close and reset both ways, a slow
// reader, a vanishing peer, abort, drain and close. It uses real loopback
// sockets. Every scenario runs TCP⇄TCP, TCP⇄Stream (a fake HBONE stream
// with goroutines of its own) and TCP⇄MuxStream: a stream of Mux, a fake
// multiplexed connection that the relay's loop owns (engine.TakeConn)
// where the backend allows, with MuxPeer, its far end, bridging each
// stream to a socket.
//
// Imports (of ours): engine and internal/nettest. Imported by: tests (the
// engine's).
package enginetest
