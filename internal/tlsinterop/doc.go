// Package tlsinterop holds the interoperability tests of our TLS 1.3 record
// layer (mtls/record) and of HBONE over it against TLS stacks written
// independently of Go's: OpenSSL (libssl) and GnuTLS. The tests build two
// small C peers (testdata/openssl_peer.c, testdata/gnutls_peer.c, sharing
// testdata/peer.h) with gcc and run them as the other end of real TCP
// connections, with our side as the daemon's 15008 server and as its
// outbound client: transfers checksummed both ways, many streams, the
// peer's KeyUpdates, padded and full-size records, a HelloRetryRequest,
// tampered and cut records, and close_notify in both orders, checked on
// what the foreign stack itself reports.
//
// The peers speak raw TLS and relay the application data to a plaintext TCP
// connection to the test, where the test's HTTP/2 side runs: the TLS stack
// under test on the far side is the foreign one, ours on the near side is
// exactly what the daemon runs.
//
// Building the peers needs gcc, libssl-dev and libgnutls28-dev
// (scripts/deps.sh installs them); without them the tests skip (counted in
// make test's skip banner), or fail when NETNSLAB_REQUIRE=1 or
// ZTUNNEL_REQUIRE_INTEROP=1 is set. The package has no non-test code.
//
// Imports (of ours): nothing of ours. Imported by: nothing of ours.
package tlsinterop
