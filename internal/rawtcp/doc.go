// Package rawtcp is a minimal user-space TCP client over an AF_PACKET socket,
// for the lab's attacker tests: it writes IPv4 or IPv6 packets with any
// destination address, including ones the kernel refuses to connect() to
// (0.0.0.0, a v4-mapped ::ffff:127.0.0.1), straight onto an interface with
// a chosen next-hop MAC, and speaks just enough TCP to the far end to
// complete a handshake, send a request, read the answer (acknowledging each
// segment) and reset the connection at the end.
//
// It is test equipment, not a TCP stack: no congestion control, no window
// scaling, no reassembly of out-of-order segments (they are dropped and
// acknowledged again, so the peer retransmits), and a fixed 64 KiB receive
// window. The parser is strict all the same (lengths, versions, fragments,
// IPv4 header and TCP checksums, unless the kernel reports the checksum was
// offloaded and not yet filled in), since a lenient one could take a stray
// packet for the peer's answer and make a test pass for the wrong reason.
//
// The kernel of the namespace the socket lives in also sees the peer's
// packets and, having no socket for them, answers a SYN-ACK with a reset:
// callers drop those resets (an iptables rule on the source port range they
// use), as the e2e attacker tests do.
//
// Imports (of ours): nothing of ours. Imported by: tests.
package rawtcp
