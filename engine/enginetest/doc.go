// Package enginetest is the conformance suite every relay backend of the
// engine passes (std, epoll, io_uring): echo with checksums, large
// transfers, many concurrent relays, half-close and reset both ways, a slow
// reader, a vanishing peer, abort, drain and close. It uses real loopback
// sockets.
//
// Imported by the engine's tests only; it imports engine and the standard
// library.
package enginetest
