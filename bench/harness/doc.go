// Package harness runs the end-to-end benchmarks: it builds a lab of network
// namespaces (two nodes; a meshed client and server pod per engine backend,
// each with its own daemon; a plain client and server pod for the direct
// path and the peers), starts the load servers and the peer proxies (Go
// io.Copy, HAProxy with and without splice, a mutual-TLS terminator, the
// naive x/net/http2 HBONE pair), measures every path with cmd/zload in
// interleaved rounds, samples the proxies' CPU and idle-connection cost
// from /proc, takes CPU profiles from the daemons' pprof endpoints, and
// returns a report.Run for package report to write.
//
// Every proxy runs where the daemon runs for the same path: client-side
// proxies in the client's pod, reached over loopback as the capture
// redirect reaches the daemon; server-side proxies in the server's pod.
// Traffic never leaves the lab's namespaces.
//
// RunCensus, instead of the measurements, counts what one 1-byte round trip
// costs each proxy process (issue 23): syscalls by kind (perf's syscall
// tracepoints; failed calls from strace), context switches of all its
// threads, CPU, and for the daemons a CPU profile and a Go execution trace
// and the goroutine wake-ups it holds, by waker and wakee (`zbench
// --syscalls N`, written to CENSUS.md).
//
// RunLoad is issue 36's Load scenario (`zbench --load`): the daemon pair and
// the HAProxy mTLS pair, paths taking turns, each loaded with thousands of
// connections at one fixed aggregate rate (zload's primed open loop); over a
// window of the steady state it reads each proxy's CPU and RSS and the
// daemons' collector (GODEBUG=gctrace=1 lines in their log), and returns a
// report.Load.
//
// RunClients is issue 36's "two clients, two verdicts" (`zbench --clients`):
// on the daemons' one- and two-hop paths and HAProxy's, zload's round trip
// and one stream, a blocking Python round-trip client (rrclient.py, embedded)
// and iperf3's one stream (its servers and an HAProxy pair in front of one
// added to the lab), rounds interleaved; WriteClients writes CLIENTS.md.
//
// Imports (of ours): bench/load, bench/report, internal/labrun and
// internal/netnslab. Imported by: bench/cmd/zbench.
package harness
