// Package proxyproto writes and parses PROXY protocol version 2 headers
// (haproxy's binary format) for TCP over IPv4 and IPv6, with TLVs.
//
// The proxy writes one in front of the stream it opens to a workload that
// has an application tunnel of protocol PROXY, carrying the client's
// address, the original target and the client's SPIFFE ID in TLV 0xD0.
// The parser is strict and checks every length against the bytes present;
// test applications use it, and it is fuzzed.
//
// Imports (of ours): nothing of ours. Imported by: proxy and tests (whose test
// applications parse the header).
package proxyproto
