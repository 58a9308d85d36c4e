package proxy

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
)

// TestTunnelKeyString pins the pool keys: a pool shared between proxies (and
// between daemon versions' expectations in dumps) must see the same strings
// as before the key became a type.
func TestTunnelKeyString(t *testing.T) {
	src := identity.New("cluster.local", "ns", "client")
	for _, tc := range []struct {
		name string
		key  tunnelKey
		want string
	}{
		{"outer", tunnelKey{
			srcID: src, dstIDs: []string{"spiffe://cluster.local/ns/ns/sa/server", "spiffe://cluster.local/ns/ns/sa/extra"},
			dst: netip.MustParseAddrPort("10.0.2.7:15008"), srcIP: netip.MustParseAddr("10.0.1.5"),
		}, "spiffe://cluster.local/ns/ns/sa/client|spiffe://cluster.local/ns/ns/sa/server,spiffe://cluster.local/ns/ns/sa/extra|10.0.1.5|10.0.2.7:15008"},
		{"outer, source without an address", tunnelKey{
			srcID: src, dstIDs: []string{"spiffe://cluster.local/ns/ns/sa/server"}, dst: netip.MustParseAddrPort("[fd00::7]:15008"),
		}, "spiffe://cluster.local/ns/ns/sa/client|spiffe://cluster.local/ns/ns/sa/server|invalid IP|[fd00::7]:15008"},
		{"inner", tunnelKey{
			srcID: src, dstIDs: []string{"spiffe://cluster.local/ns/ns/sa/echo"},
			dst: netip.MustParseAddrPort("10.1.0.9:15008"), inner: "ns/echo.ns.svc.cluster.local",
		}, "inner|spiffe://cluster.local/ns/ns/sa/client|spiffe://cluster.local/ns/ns/sa/echo|10.1.0.9:15008|ns/echo.ns.svc.cluster.local"},
	} {
		if got := tc.key.String(); got != tc.want {
			t.Errorf("%s: key %q, want %q", tc.name, got, tc.want)
		}
	}
}
