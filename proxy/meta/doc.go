// Package meta parses and formats the request metadata headers HBONE
// carries besides the authority: Forwarded (RFC 7239), W3C baggage with
// the workload keys ztunnel uses, and W3C traceparent.
//
// The values come from peers, so every parser is strict, bounded, returns
// a clear error and is fuzzed. Formatting is the inverse of parsing.
//
// Imports (of ours): nothing of ours. Imported by: proxy and tests.
package meta
