// Package poll is the engine's epoll binding: an epoll instance with an
// eventfd that other goroutines use to wake the single goroutine waiting on
// it.
//
// The binding is mechanism only. Callers choose level- or edge-triggered
// interest per descriptor (pass ET in the event mask for edge-triggered);
// the engine's event loops register sockets edge-triggered for both
// directions once, keep readiness in user space and never call epoll_ctl
// again for the life of a connection. The wake-up eventfd itself is
// level-triggered and drained by Wait.
//
// Two ways to wait: Wait blocks the calling thread in epoll_wait (for a
// loop that owns a locked OS thread); WaitPark polls without blocking and
// otherwise parks the goroutine in the Go runtime's netpoller on the epoll
// descriptor itself, so the scheduler wakes the loop like any goroutine
// blocked on a socket, with no thread handoff.
//
// Wake is safe from any goroutine and coalesces: at most one wake-up is
// pending at a time, so a burst of producers costs one eventfd write and one
// return from the wait. Everything else (Add, Modify, Delete, Wait,
// WaitPark) belongs to the owner goroutine that runs the loop.
//
// Imports (of ours): nothing of ours (only golang.org/x/sys/unix). Imported
// by: engine.
package poll
