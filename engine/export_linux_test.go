package engine

// SetNoPeek makes new TCP⇄stream relays copy with TryRead even from a
// StreamPeeker (true) or lend its buffer as in production (false), so
// benchmarks measure both in one run.
func SetNoPeek(v bool) { noPeek = v }
