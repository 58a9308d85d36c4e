// Package uring is the engine's own io_uring binding, written over
// golang.org/x/sys/unix: ring setup and mmaps, submission and completion
// queues with the kernel's memory ordering, io_uring_enter with timeouts,
// registration (probe, eventfd, provided-buffer rings) and the SQE
// preparations the engine uses (accept, poll, recv, send, splice, read,
// close, shutdown, timeout, cancel, nop).
//
// A Ring belongs to one goroutine, locked to its OS thread when the ring is
// set up with SingleIssuer (the kernel then insists that one thread submit).
// Memory ordering follows the kernel's ring protocol: the owner publishes
// the SQ tail and the CQ head with release stores and reads the SQ head and
// the CQ tail with acquire loads (Go's sync/atomic operations are at least
// that strong on every architecture).
//
// Anything an SQE points to (buffers, timespecs) must be Go heap memory that
// the caller keeps reachable until the matching completion arrives; Go's
// collector does not move heap objects.
//
// Imports (of ours): nothing of ours (only golang.org/x/sys/unix). Imported
// by: engine.
package uring
