// Package e2e holds the end-to-end tests: real daemons in network-namespace
// pods (internal/netnslab), real capture rules, real sockets, real TLS and
// HTTP/2. They need root and the lab tools, and skip without them through
// netnslab.Skip, which make test counts and reports at the end
// (NETNSLAB_REQUIRE=1 makes them fail instead, as CI sets). Imports (of ours):
// nothing of ours (only its tests import the lab, the daemon and the test
// kits). Imported by: nothing.
package e2e
