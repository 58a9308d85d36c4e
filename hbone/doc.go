// Package hbone speaks HBONE: HTTP/2 CONNECT tunnels (RFC 9113 section 8.5) over
// an already established connection, as Istio's ztunnel does between meshed pods.
//
// It is a purpose-built HTTP/2 endpoint for exactly one job, carrying CONNECT
// streams: a client ([ClientConn], pooled by [Pool]) and a server ([Server]).
// It uses the frame parser and HPACK of golang.org/x/net/http2 but none of its
// Transport or Server machinery, so that the per-byte cost stays low:
//
//   - no goroutine per stream: an event loop drives the connection
//     (Config.Drive, the daemon's default: the loop reads, processes and
//     flushes on its own goroutine), or else exactly one reader goroutine
//     and one writer goroutine do, through the same parser and write
//     buffer;
//   - streams append frames to a shared, bounded write buffer which the writer
//     (the event loop, or the writer goroutine) flushes with one write per
//     batch, so frames of many streams coalesce into few syscalls (and few
//     TLS records);
//   - received DATA is copied once, from the connection into pooled per-stream
//     chunks that are returned as soon as they are read, so an idle stream
//     holds no buffer; an event loop (Stream.Peek) writes to its socket
//     straight from those chunks;
//   - flow control follows RFC 9113 exactly on both the stream and the
//     connection windows, and WINDOW_UPDATEs are batched (sent when half a
//     window has been consumed by the reader).
//
// TLS, identities and policy are not this package's business: it receives a
// net.Conn (in production a *tls.Conn that negotiated ALPN "h2") and hands
// CONNECT requests to a [Handler]. The writer hands each batch of frames to
// the connection with one Write: the daemon's mtls/record connection seals
// it into records and sends them with one syscall (crypto/tls instead writes
// each 16 KiB record with its own syscall). An event loop can also read its
// socket straight into the write buffer ([Stream.WriteFrom]).
//
// # Conformance
//
// The server is tested against h2spec, the field's HTTP/2 conformance suite
// (every section, strict cases included), over mtls/record with the daemon's
// TLS configuration; the few cases that cannot apply to a CONNECT-only
// server, whose answer to h2spec's GETs is a bodiless 400, are listed in
// docs/h2spec.md and each is proven with the same frames on a CONNECT
// stream. Frames on streams that are no longer open are answered by how the
// stream closed (RFC 9113 section 5.1): a server connection remembers the
// last 32 closings and the last 8 ranges of stream identifiers the client
// skipped; DATA or trailers on an older closed stream are ignored, as ones
// that crossed our RST_STREAM must be.
//
// # Closing
//
// Every way a connection ends — the peer's end of stream, a local Close,
// a drain (GOAWAY), a protocol error, a failed read or write of the
// transport — closes the transport through its own Close, so that a TLS
// transport sends what it owes the peer: close_notify (RFC 8446 section
// 6.1) or the fatal alert a failed read left owed (section 6.2). A
// graceful close flushes and half-closes first (the TLS CloseWrite sends
// close_notify) and waits a little for the peer's end; an abrupt one bounds
// the transport's Close (mtls/record bounds its own; under a *tls.Conn the
// socket is closed after abruptCloseTimeout), so a peer that stopped
// reading holds no goroutine long. After a failed write nothing can follow
// what it cut, and the socket is closed at once.
//
// # Code map
//
// One connection has one owner, its *conn, whose code is split by role
// (as quic-go splits its connection), and one driver, which does its
// socket I/O behind a small seam:
//
//   - conn.go: the connection's fields, construction, lifecycle and close
//     (GOAWAY, shutdown);
//   - conn_streams.go: the stream table: opening limits, retiring and
//     resetting streams, the drain a freed slot may start;
//   - conn_write.go: the write path: the shared write buffer, committing
//     frames to it, the drivers' hand-over of it, DATA batching, control
//     frames and the bound on their backlog;
//   - conn_flow.go: flow control: send and receive windows of the
//     connection and its streams, WINDOW_UPDATE accounting;
//   - conn_timers.go: the keepalive PING and a pooled connection's idle
//     timer;
//   - driver.go: the seam (driver) and the choice of driver, settled
//     before the connection is published (takeDriver: a loop's handle
//     exists before the loop may call the connection), then started;
//     driver_goroutines.go the goroutine driver (goDriver: a reader and a
//     writer goroutine, the transport's close); driver_loop.go the loop driver (loopDriver, the Driven that
//     Config.Drive hands an event loop, and Owner, the loop's handle,
//     through whose WakeLocal the read path wakes streams: the read turn
//     over the pump, the loop's flush of the write buffer, the close
//     through the loop);
//   - pump.go: the read pump: the plaintext buffer c.in (readBuf, grown
//     alike for both drivers' reads) and step, which processes what c.in
//     holds frame by frame without blocking;
//   - read.go: the frames the read path handles and the peer's reset
//     budget; server.go and client.go the request and response HEADERS of
//     each side, history.go how recent streams closed; Server.Start
//     serves a connection without holding its caller (done comes at its
//     end), ServeConn is Start and a wait;
//   - stream.go: a Stream's blocking Read, Write, Close and deadlines;
//     stream_poll.go the non-blocking side an event loop drives;
//   - buffer.go the pooled receive chunks and write buffers, frame.go the
//     frame encoders, headers.go the header rules;
//   - pool.go the client Pool, streamconn.go tunnels inside tunnels.
//
// # Errors
//
// Connect returns a [*StatusError] for a non-200 answer. Stream reads and
// writes return io.EOF after the peer's END_STREAM, a [*StreamError] after a
// reset, [ErrStreamClosed] after a local Close or Reset, and an error
// matching [ErrConnClosed] (wrapping a [*GoAwayError], a [*ConnError] or a
// network error) when the connection ends.
//
// Imports (of ours): nothing of ours. Imported by: bench/load,
// hbone/hbonetest, internal/app, internal/labrun, proxy and tests.
package hbone
