package engine

import "io"

// This file is the seam for TCP⇄stream relays in the event loops (the
// HBONE issue). Start hands a TCPEndpoint paired with a
// StreamEndpoint to the epoll loops (epoll_stream_linux.go); the std and
// io_uring backends relay such pairs with goroutines through the Endpoint
// methods.
//
// How the loop drives a TCP socket S and a stream T:
//
//   - S→T, gated by T's send window. The loop reads S only while
//     T.WriteWindow() > 0, and at most that many bytes, into a pooled buffer
//     whose size adapts to the flow (1 KiB, then 16 KiB, then 256 KiB after
//     reads that fill the buffer, as ztunnel grows its buffers), then
//     TryWrite copies them into the stream's send queue and the buffer goes
//     back to the pool at once (if TryWrite takes only part, the loop calls
//     it again: only one that takes nothing promises a Wake). With the
//     window shut the loop stops reading S, so TCP flow control pushes back
//     on the sender, and waits for Wake.
//   - T→S, acknowledged by reading. On Wake the loop calls TryRead into a
//     pooled buffer and writes to S; bytes S does not take stay in that
//     buffer (the only buffer an idle-in-one-direction relay can hold) until
//     S is writable. TryRead is what returns receive window to the peer
//     (WINDOW_UPDATE), so a slow S slows the peer down. A StreamPeeker
//     (an hbone.Stream) saves that copy and buffer: the loop writes to S
//     from the view Peek returns and Consumes what S took. The other way, a
//     StreamFiller lets the loop read S straight into T's send buffer.
//     A stream that knows DirectSink (hbone's) skips the loop on that
//     path when the loop holds none of its bytes: its reader goroutine
//     writes the payload to S itself (see DirectSink), and only what S
//     does not take is buffered for the loop and woken for.
//   - FIN both ways: EOF on S becomes T.CloseWrite (END_STREAM); io.EOF from
//     TryRead becomes shutdown(S, SHUT_WR).
//   - RST both ways: an error on S becomes T.Abort (RST_STREAM); an error
//     from TryRead/TryWrite (RST_STREAM, connection loss) resets S.
//   - Counters move as bytes are written to their destination, as for
//     TCP⇄TCP.
//
// An idle TCP⇄stream relay then holds no goroutine and no buffer: only the
// loop's record, the socket and the stream's own state.

// StreamEndpoint is an Endpoint an event loop can drive without a goroutine:
// a multiplexed stream (an HBONE CONNECT stream) whose connection goroutines
// own the framing, the receive buffer and the send window.
//
// TryRead, TryWrite, WriteWindow, CloseWrite and Abort are called from one
// loop goroutine at a time; SetWaker once before the first of them and once
// (with nil) after the last.
type StreamEndpoint interface {
	Endpoint
	// SetWaker registers w, nil to remove it. The stream calls w.Wake from
	// any goroutine, without blocking and possibly spuriously, whenever
	// TryRead or TryWrite could make progress they could not make before:
	// data, END_STREAM or RST_STREAM arrived, or the send window opened.
	SetWaker(w Waker)
	// TryRead copies received bytes into p without blocking. (0, nil) means
	// none are buffered now: wait for Wake. It returns io.EOF after the
	// peer's END_STREAM and another error after a reset or the
	// connection's loss. Bytes read are the ones whose receive window the
	// stream returns to the peer.
	TryRead(p []byte) (int, error)
	// TryWrite queues up to len(p) bytes as DATA within the current send
	// window without blocking and returns how many it took; 0 with a nil
	// error means the window is shut: wait for Wake. Taking part of p owes
	// no Wake (the window may have shrunk since WriteWindow): call again
	// until it takes nothing before waiting. p may be reused once it
	// returns.
	TryWrite(p []byte) (int, error)
	// WriteWindow reports how many bytes TryWrite would take now, so the
	// loop never reads from the socket bytes it cannot forward.
	WriteWindow() int
}

// StreamPeeker is a StreamEndpoint that can also lend its received bytes:
// the loop then writes them to the socket straight from the stream's
// buffer (T→S without TryRead's copy, and without a relay buffer for that
// direction).
type StreamPeeker interface {
	// Peek appends to views (at most cap(views)) the received bytes, as
	// views valid until Consume. None with a nil error means none are
	// buffered now: wait for Wake. Errors are TryRead's (io.EOF after
	// END_STREAM).
	Peek(views [][]byte) ([][]byte, error)
	// Consume drops the first n bytes of the views (n may be 0) and ends
	// them; the bytes count as read, as with TryRead.
	Consume(n int)
}

// StreamFiller is a StreamEndpoint that lets the loop read the socket
// straight into its send path (S→T without TryWrite's copy and without a
// relay buffer for that direction).
type StreamFiller interface {
	// WriteFrom calls src.Read once, with room for at most limit bytes in
	// the stream's own send buffer, and queues what it read. src is not
	// read when nothing fits now; then (0, nil, nil) means wait for Wake,
	// as a TryWrite that takes nothing. readErr is src's error (nothing
	// queued); writeErr is the stream's, as TryWrite's. src.Read must not
	// block.
	WriteFrom(limit int, src io.Reader) (n int, readErr, writeErr error)
}

// DirectSink is the Waker an epoll loop's TCP⇄stream relay registers: a
// stream that knows it (an hbone.Stream, which asserts its own DirectSink
// with the same methods on the Waker it is given) may hand received bytes
// to TryDeliver from the goroutine that received them, and the relay writes
// them to its socket at once, without a wake-up of the loop: the response
// half of a round trip then crosses no goroutine.
//
// The contract, both sides:
//
//   - The stream calls TryDeliver(p) only when every byte it received
//     before p has been taken (by TryRead, Peek+Consume or TryDeliver):
//     nothing is buffered or lent. It calls it with the lock its TryRead,
//     Peek and SetWaker take held, so that SetWaker(nil) is a barrier:
//     after it returns no TryDeliver runs, and the relay may close the
//     socket.
//   - TryDeliver writes what the socket takes now with one non-blocking
//     write and returns how much (0: not now). It takes nothing while the
//     loop holds bytes of that direction or is taking some (flagDownBusy,
//     set before its TryRead or Peek), so bytes never overtake each other.
//     It must not block or call back into the stream.
//   - The stream keeps p[n:] as received bytes and wakes the relay as for
//     any data; the n bytes count as read (their window goes back to the
//     peer as with TryRead). END_STREAM or a reset after them reaches the
//     loop as usual, through TryRead or Peek, once nothing is left.
//   - The relay counts the bytes (the session's counters) and marks itself
//     active for the idle timeout (flagDirect, read by the loop when the
//     relay would expire).
type DirectSink interface {
	Waker
	TryDeliver(p []byte) int
}

// Waker is how a stream tells its event loop to look at it again. Wake must
// be cheap and non-blocking: the engine's implementation queues a task for
// the owning loop and coalesces wake-ups.
type Waker interface {
	Wake()
}
