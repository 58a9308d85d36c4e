// Package netns runs a function on an OS thread switched into a network
// namespace, and back: the one runner behind the daemon's pod sockets
// (inpod.Netns.Run) and the lab's (netnslab.NS.Do), so that the reasoning
// that makes it safe in a Go process is written, and kept right, once.
//
// Imports (of ours): nothing of ours. Imported by: inpod and
// internal/netnslab.
package netns

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// ErrGoexit reports that the function passed to Run ended its goroutine
// (runtime.Goexit, or t.FailNow in a test) instead of returning.
var ErrGoexit = errors.New("netns: function passed to Run called runtime.Goexit (t.FailNow?)")

// Run calls fn on an OS thread switched into the network namespace open at
// descriptor target and returns its error; name names the namespace in
// errors. Afterwards the thread is switched to home, a descriptor of the
// namespace every unlocked thread of the process is in (-1: Run opens the
// thread's own through /proc/thread-self before the switch; a caller that
// runs often holds it open instead, which saves about half the cost).
// Sockets fn creates (directly, on its own goroutine) belong to the
// namespace for life, wherever they are used afterwards.
//
// Why this is safe in a Go process:
//   - A network namespace is a property of the OS thread (setns(2) with
//     CLONE_NEWNET changes only the calling thread), and Go moves goroutines
//     between threads. fn therefore runs on a fresh goroutine locked to its
//     thread (runtime.LockOSThread) for the whole switch: no other goroutine
//     can run on that thread while it is in the namespace, and fn cannot
//     migrate away from it.
//   - The runtime never clones a new thread from a locked one (it asks its
//     template thread to do it), so no thread is ever born inside the
//     namespace.
//   - Afterwards the thread is switched back and unlocked, and returns clean
//     to the scheduler. If switching back fails, the goroutine exits still
//     locked, and the runtime then terminates the thread rather than reuse
//     it: a thread stuck in a pod would silently put unrelated goroutines'
//     sockets there.
//   - fn must do its socket work synchronously: goroutines it starts run on
//     other threads, outside the namespace. net.Dialer with an IP literal
//     and net.ListenConfig create their one socket on the calling goroutine.
//
// Concurrent calls are fine (each has its own thread). A blocked fn (a dial
// waiting for its SYN-ACK) holds its thread until it returns. A panic in fn
// is re-raised in the caller; fn ending its goroutine returns ErrGoexit.
func Run(target, home int, name string, fn func() error) error {
	type result struct {
		err      error
		panicked bool
		val      any
		stack    []byte
	}
	done := make(chan result, 1)
	go func() {
		var res result
		defer func() { done <- res }()
		runtime.LockOSThread()
		if home < 0 {
			fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				runtime.UnlockOSThread()
				res.err = fmt.Errorf("netns: open current netns: %w", err)
				return
			}
			defer unix.Close(fd)
			home = fd
		}
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			// Still in the original namespace: the thread is clean.
			runtime.UnlockOSThread()
			res.err = fmt.Errorf("netns: setns into %s: %w", name, err)
			return
		}
		defer func() {
			if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
				res.err = errors.Join(res.err, fmt.Errorf("netns: setns back from %s (thread discarded): %w", name, err))
				return // stay locked: the runtime ends the thread with the goroutine
			}
			runtime.UnlockOSThread()
		}()
		completed := false
		defer func() {
			if completed {
				return
			}
			if r := recover(); r != nil {
				res.panicked, res.val, res.stack = true, r, debug.Stack()
				return
			}
			res.err = ErrGoexit
		}()
		res.err = fn()
		completed = true
	}()
	res := <-done
	if res.panicked {
		panic(fmt.Sprintf("netns: panic in Run(%s): %v\n%s", name, res.val, res.stack))
	}
	return res.err
}
