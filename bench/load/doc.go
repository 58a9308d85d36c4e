// Package load generates benchmark load over plain TCP, TLS and HBONE, and
// serves the matching echo/sink server: the engine of cmd/zload.
//
// Its single job is measuring one endpoint from the client side: throughput
// (N streams for a duration, Gbit/s as acknowledged by the server),
// request/response latency (closed loop or fixed rate, HdrHistogram
// percentiles), connection rate (a new connection per request), and the
// resource cost of idle connections to a proxy process (RSS, fds and
// goroutines read from /proc and from a pprof endpoint).
//
// Client and server speak a 16-byte header at the start of every connection
// that tells the server what to do (echo, sink, request/response, one
// request then close); Raw mode drops it so the client can load any echo
// server. Every run is bounded by a duration or a count, with maximums
// enforced by Validate.
//
// Imports (of ours): hbone, identity, mtls, mtls/caclient and mtls/record.
// Imported by: bench/cmd/zbench (Main), bench/cmd/zpeer, bench/harness,
// bench/peers (Acceptor), bench/report (for the result types), cmd/zload and
// tests.
package load
