package engine

// SetNoPeek makes e's new TCP⇄stream relays copy with TryRead even from a
// StreamPeeker (true) or lend its buffer as in production (false), so
// benchmarks measure both in one run. Set it before the first relay.
func SetNoPeek(e *Engine, v bool) { e.noPeek = v }
