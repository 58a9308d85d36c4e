package engine

// SetNoPeek makes e's new TCP⇄stream relays copy with TryRead even from a
// StreamPeeker (true) or lend its buffer as in production (false), so
// benchmarks measure both in one run. Set it before the first relay.
func SetNoPeek(e *Engine, v bool) { e.noPeek = v }

// DirectShortWrites counts the direct writes (TryDeliver) of e's stream
// relays that the socket did not take whole: a partial write or EAGAIN.
func DirectShortWrites(e *Engine) int64 {
	return sumLoops(e, false, func(l *eloop) int64 { return l.nDirectShort.Load() })
}

// SetStreamWaitBlock makes e's stream loops block their goroutine in
// epoll_wait, as Config.BlockStreamLoops does, on an engine made without
// it, so benchmarks can compare both in one engine set-up. Set it before
// the first relay.
func SetStreamWaitBlock(e *Engine) {
	if b, ok := e.backend.(*epollBackend); ok {
		for _, l := range b.strm {
			l.blocking = true
		}
	}
}

// PollerWakes counts the wake-ups e's epoll loops were sent through their
// pollers (eventfd writes or deadline pokes) since e started.
func PollerWakes(e *Engine) int64 {
	return sumLoops(e, false, func(l *eloop) int64 { return l.nWakeups.Load() })
}

// LoopYields counts the yields e's epoll loops made to keep their
// scheduling tick moving (blockingYieldEvery).
func LoopYields(e *Engine) int64 {
	return sumLoops(e, false, func(l *eloop) int64 { return l.nYields.Load() })
}

// LoopWaits counts the waits e's epoll stream loops returned from since e
// started (an idle loop makes none).
func LoopWaits(e *Engine) int64 {
	return sumLoops(e, true, func(l *eloop) int64 { return l.nWaits.Load() })
}

// sumLoops adds up f over e's epoll loops (only its stream loops with
// strmOnly); 0 on another backend.
func sumLoops(e *Engine, strmOnly bool, f func(*eloop) int64) int64 {
	b, ok := e.backend.(*epollBackend)
	if !ok {
		return 0
	}
	loops := b.loops
	if strmOnly {
		loops = b.strm
	}
	var n int64
	for _, l := range loops {
		n += f(l)
	}
	return n
}
