// Package nettest is the TCP test kit: connected loopback TCP pairs (the one
// pair helper of the module) and their descriptors detached as the engine
// detaches them, test applications (Server: an accept loop running a handler
// per connection, such as Echo) that end with their test, the round-trip
// checks tests run through them, and Until, the one wait for a condition
// that nothing signals. It is a plain package, not a _test file, so tests of
// every package (and the lab's apps) share one echo rather than a copy each.
// Imports (of ours): nothing of ours. Imported by: engine/enginetest (its
// pairs), internal/labrun (its echo app) and tests.
package nettest
