// Package enginetest is the conformance suite every relay backend of the
// engine passes (std, epoll, io_uring): echo with checksums, large
// transfers, many concurrent relays, half-close and reset both ways, a slow
// reader, a vanishing peer, abort, drain and close. It uses real loopback
// sockets.
//
// Imports (of ours): engine. Imported by: tests (the engine's).
package enginetest
