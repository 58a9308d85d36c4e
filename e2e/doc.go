// Package e2e holds the end-to-end tests: real daemons in network-namespace
// pods (internal/netnslab), real capture rules, real sockets, real TLS and
// HTTP/2. They need root and skip without it (NETNSLAB_REQUIRE=1 makes
// them fail instead, as CI sets).
package e2e
