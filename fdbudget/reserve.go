package fdbudget

// Reserve sizes: see DefaultReserve.
const (
	// reserveFixed covers what the daemon holds whatever it serves: about
	// a hundred for stdio and log files, the runtime's poller, the xDS and
	// CA connections, the admin, metrics and readiness listeners and their
	// clients and the CRL file, and about ten for each of ~90 pods: its
	// network namespace, its listeners (15001, 15006, 15008, 15080, four
	// DNS sockets) and DNS upstream sockets.
	reserveFixed = 1024
	// reservePerLoop covers an event loop's own descriptors (its epoll and
	// eventfd, or its io_uring) and its pool of empty splice pipes (up to 64
	// kept, two descriptors each).
	reservePerLoop = 2 + 64*2
)

// DefaultReserve is the part of limit kept out of the budget for the
// daemon's own descriptors, with loops the engine's event loops (both
// kinds): an eighth of the limit, at least reserveFixed plus
// reservePerLoop per loop, and at most half the limit, so that a small
// limit still leaves a budget. Pipes a relay holds while the bytes it
// moves are in flight are not counted per connection; the eighth is their
// room.
func DefaultReserve(limit, loops int) int {
	r := max(limit/8, reserveFixed+reservePerLoop*max(loops, 1))
	return min(r, limit/2)
}
