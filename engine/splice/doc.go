// Package splice moves bytes between sockets through kernel pipes with
// splice(2), so relayed data is never copied into user space, and pools the
// pipes so that a pipe is held only while data is in flight.
//
// A Pool belongs to one goroutine (an event loop): it has no locks. A Pipe
// goes back to its Pool only when empty; a pipe that still holds bytes when
// its relay dies is closed instead, since its contents belong to no one.
//
// Imports (of ours): nothing of ours (only golang.org/x/sys/unix). Imported
// by: engine and tests.
package splice
