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
// Three ways to wait: Wait blocks the calling thread in epoll_wait;
// WaitPark polls without blocking and otherwise parks the goroutine in the
// Go runtime's netpoller on the epoll descriptor itself, so the scheduler
// wakes the loop like any goroutine blocked on a socket, with no thread
// handoff; WaitParkOnce parks the same way on a duplicate registered for
// that wait only, for a loop that blocks while it has work and parks while
// it has none (a thread in a system call keeps its P until the runtime's
// monitor takes it back, which can take 10-20 ms).
//
// Wake is safe from any goroutine and coalesces: at most one wake-up is
// pending at a time, so a burst of producers costs one eventfd write and one
// return from the wait. Everything else (Add, Modify, Delete, Wait,
// WaitPark) belongs to the owner goroutine that runs the loop.
//
// Imports (of ours): nothing of ours (only golang.org/x/sys/unix). Imported
// by: engine.
package poll
