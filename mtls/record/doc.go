// Package record is a TLS 1.3 connection whose handshake is crypto/tls's and
// whose application data is protected here (RFC 8446 sections 5 and 7), so
// that bytes move between the caller's buffers and the socket with as few
// passes as possible: a Write seals all its records into one pooled buffer
// and sends them with one write system call (WriteLent and TryWriteLent
// seal them straight from a buffer the caller lends, without copying it
// first); a Read decrypts straight from the socket buffer into the
// caller's slice when the record fits.
//
// Certificates, verification callbacks, ALPN and every handshake decision
// stay with crypto/tls. The traffic secrets are learnt through a
// per-connection tls.Config.KeyLogWriter and never leave the connection
// (a KeyLogWriter the caller set still receives its lines). Connections whose
// parameters the record layer does not cover (a cipher suite other than
// AES-GCM, TLS 1.2, a server that would send session tickets, secrets not
// logged) keep using the *tls.Conn for their data, behind the same API.
//
// The read path enforces RFC 8446's record rules (sections 5 and 6): a
// record too long before or after decryption (2^14+256 bytes of
// ciphertext, 2^14+1 of inner plaintext, padding included) is
// record_overflow, one that fails authentication bad_record_mac, a missing
// content type or an unexpected message unexpected_message; each fails the
// connection for good and leaves the alert owed. Close sends what is owed,
// close_notify or that fatal alert, on every ending (after the peer's
// close_notify, after a failed Read, on a local close), once a Write in
// progress has finished; it spends at most closeAlertTimeout on a peer
// that stopped reading, then closes the socket without it.
//
// A connection can also be driven by an event loop that owns the socket
// (fd mode, loop.go): after UseFD every read and write is one non-blocking
// system call on the caller's descriptor, made by TryRead, TryWrite (and
// TryWriteLent), TryFlush, TryKeyUpdate and TryClose; Drained tells an edge-triggered
// caller when it may wait for the next edge. The record rules are the same
// code as Read's and Write's; held records are bounded by one output buffer
// (TryWrite refuses past it); the connection never closes the descriptor,
// and the blocking methods return ErrFDMode.
//
// Packages that carry HBONE over TLS may import it. Imports (of ours): nothing
// of ours (only the standard library). Imported by: bench/load, proxy and
// tests.
package record
