// Package socks5 speaks the server side of the SOCKS5 handshake (RFC 1928)
// as ztunnel's 15080 listener does: no authentication only, CONNECT only,
// IPv4, IPv6 and domain-name targets.
//
// It reads exactly the bytes of the handshake and never more, so the caller
// can hand the connection to a relay afterwards without losing data the
// client sent early. Every read has a fixed upper size; deadlines are the
// caller's (set them on the net.Conn before calling [Handshake]).
//
// Imports (of ours): nothing of ours. Imported by: proxy and tests.
package socks5
