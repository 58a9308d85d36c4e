package proxy

import (
	"errors"
	"flag"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/state"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/accesslog.golden")

// TestAccessLogGolden renders the "connection complete" fields of each kind
// of connection the way the daemon logs them, and compares them line by
// line with testdata/accesslog.golden, which follows ztunnel's access_log!
// in src/proxy/metrics.rs: the same keys in the same order (src.addr,
// src.workload, src.namespace, src.identity, src.cluster, dst.addr,
// dst.hbone_addr, dst.service, dst.workload, dst.namespace, dst.identity,
// dst.cluster, direction, bytes_sent, bytes_recv, duration), unknown values
// left out, identities only for mTLS, dst.addr the address dialled
// (outbound) or the one the tunnel arrived on (inbound HBONE), the
// workloads named by pod name (or, known only from baggage, by canonical
// service), the destination of double HBONE as its answer described it.
func TestAccessLogGolden(t *testing.T) {
	p := &Proxy{router: newRouter(&Config{TrustDomain: "cluster.local"})}
	client := &state.Workload{UID: "c1//Pod/ns-a/client-7d4", Name: "client-7d4",
		Labels: &state.WorkloadLabels{Namespace: "ns-a", ServiceAccount: "client", WorkloadName: "client", CanonicalName: "client", CanonicalRevision: "v1", ClusterID: "c1"}}
	server := &state.Workload{UID: "c1//Pod/ns-b/server-5f9", Name: "server-5f9",
		Labels: &state.WorkloadLabels{Namespace: "ns-b", ServiceAccount: "server", WorkloadName: "server", CanonicalName: "server", CanonicalRevision: "v2", ClusterID: "c1"}}
	waypoint := &state.Workload{UID: "c1//Pod/ns-b/waypoint-1", Name: "waypoint-1",
		Labels: &state.WorkloadLabels{Namespace: "ns-b", ServiceAccount: "waypoint", WorkloadName: "waypoint", CanonicalName: "waypoint", ClusterID: "c1"}}
	gateway := &state.Workload{UID: "c1//Pod/istio-system/eastwest-1", Name: "eastwest-1",
		Labels: &state.WorkloadLabels{Namespace: "istio-system", ServiceAccount: "eastwest", WorkloadName: "eastwest", CanonicalName: "eastwest", ClusterID: "c1"}}
	svc := &state.Service{Name: "server", Namespace: "ns-b", Hostname: "server.ns-b.svc.cluster.local"}
	clientID, serverID := client.Identity(), server.Identity()
	ap := netip.MustParseAddrPort
	withBytes := func(ci *conn) *conn {
		ci.counters.AToB.Store(11)
		ci.counters.BToA.Store(22)
		return ci
	}

	cases := []struct {
		name string
		ci   *conn
	}{
		{"outbound HBONE to a service endpoint", withBytes(&conn{
			src: ap("10.0.1.5:40000"), dst: ap("10.0.2.7:15008"), mtls: true,
			ext:         &connExt{hboneAddr: "10.0.2.7:8080", origDst: ap("10.96.0.10:80")},
			srcWorkload: client, srcIdentity: &clientID, dstWorkload: server, service: svc,
		})},
		{"outbound plain TCP to a workload", withBytes(&conn{
			src: ap("10.0.1.5:40001"), dst: ap("10.0.2.7:8080"),
			srcWorkload: client, dstWorkload: server,
		})},
		{"outbound passthrough to an unknown address", withBytes(&conn{
			src: ap("10.0.1.5:40002"), dst: ap("93.184.216.34:443"), srcWorkload: client,
		})},
		{"outbound through a service waypoint", withBytes(&conn{
			src: ap("10.0.1.5:40003"), dst: ap("10.0.2.9:15008"), mtls: true,
			ext:         &connExt{hboneAddr: "10.96.0.10:80", origDst: ap("10.96.0.10:80")},
			srcWorkload: client, srcIdentity: &clientID, dstWorkload: waypoint, service: svc,
		})},
		{"outbound double HBONE", withBytes(&conn{
			src: ap("10.0.1.5:40004"), dst: ap("172.30.0.20:15008"), mtls: true,
			ext: &connExt{hboneAddr: "server.ns-b.svc.cluster.local:80", origDst: ap("10.96.0.10:80"), double: true, hasBaggage: true,
				baggage: "k8s.cluster.name=c2,k8s.namespace.name=ns-b,k8s.deployment.name=server,service.name=server,service.version=v2",
				peerID:  &serverID},
			srcWorkload: client, srcIdentity: &clientID, dstWorkload: gateway, service: svc,
		})},
		{"inbound HBONE", withBytes(&conn{
			inbound: true, src: ap("10.0.1.5:51000"), dst: ap("10.0.2.7:8080"), mtls: true,
			ext: &connExt{hboneAddr: "10.0.2.7:8080", arrivedOn: ap("10.0.2.7:15008"), forHost: "server.ns-b.svc.cluster.local",
				baggage: "k8s.cluster.name=c1,k8s.namespace.name=ns-a,k8s.deployment.name=client,service.name=client,service.version=v1"},
			srcWorkload: client, srcIdentity: &clientID, dstWorkload: server, service: svc,
		})},
		{"inbound HBONE through a network gateway", withBytes(&conn{
			inbound: true, src: ap("172.30.0.20:51001"), dst: ap("10.0.2.7:8080"), mtls: true,
			ext: &connExt{hboneAddr: "server.ns-b.svc.cluster.local:80", arrivedOn: ap("10.0.2.7:15008"),
				baggage: "k8s.cluster.name=c2,k8s.namespace.name=ns-far,k8s.deployment.name=remote,service.name=remote-app"},
			srcIdentity: &identity.Identity{TrustDomain: "cluster.local", Namespace: "ns-far", ServiceAccount: "remote"},
			dstWorkload: server, service: svc,
		})},
		{"inbound plaintext", withBytes(&conn{
			inbound: true, src: ap("10.0.1.5:51002"), dst: ap("10.0.2.7:8080"),
			srcWorkload: client, dstWorkload: server, service: svc,
		})},
		{"SOCKS5 to a service hostname (resolved to its VIP, then as outbound)", withBytes(&conn{
			src: ap("127.0.0.1:40005"), dst: ap("10.0.2.7:15008"), mtls: true,
			ext:         &connExt{hboneAddr: "10.0.2.7:8080", origDst: ap("10.96.0.10:80")},
			srcWorkload: client, srcIdentity: &clientID, dstWorkload: server, service: svc,
		})},
	}
	failures := []struct {
		name string
		ci   *conn
		err  error
	}{
		{"outbound with no route", &conn{src: ap("10.0.1.5:40006"), dst: ap("10.96.0.99:80")}, errors.New("no healthy upstream")},
		{"inbound HBONE refused before its context", &conn{inbound: true, src: ap("10.0.1.5:51003"), mtls: true,
			ext: &connExt{hboneAddr: "10.0.9.9:8080", arrivedOn: ap("10.0.2.7:15008")}},
			errIPMismatch(netip.MustParseAddr("10.0.2.7"), netip.MustParseAddr("10.0.9.9"))},
	}
	// Connections refused once their context was known: "connection
	// complete" with every field and the error (ztunnel's wording, which
	// operators match).
	refused := []struct {
		name string
		ci   *conn
		err  error
	}{
		{"inbound HBONE refused by an ALLOW policy for another principal", &conn{
			inbound: true, src: ap("10.0.1.5:51004"), dst: ap("10.0.2.7:8080"), mtls: true,
			ext:         &connExt{hboneAddr: "10.0.2.7:8080", arrivedOn: ap("10.0.2.7:15008")},
			srcWorkload: client, srcIdentity: &clientID, dstWorkload: server,
		}, errPolicyRejection(state.ReasonNoAllowMatched)},
		{"inbound plaintext refused by a DENY policy", &conn{
			inbound: true, src: ap("10.0.1.5:51005"), dst: ap("10.0.2.7:8080"),
			srcWorkload: client, dstWorkload: server,
		}, errPolicyRejection("explicitly denied by: ns-b/deny-all")},
	}
	var got strings.Builder
	for _, tc := range cases {
		tc.ci.p = p
		l := tc.ci.labels()
		got.WriteString("# " + tc.name + "\n")
		for i, a := range tc.ci.attrs(&l, true) {
			if i > 0 {
				got.WriteByte(' ')
			}
			v := a.Value.String()
			if a.Key == "duration" {
				v = "<ms>"
			}
			got.WriteString(a.Key + "=" + v)
		}
		got.WriteByte('\n')
	}
	for _, tc := range failures {
		got.WriteString("# connection failed: " + tc.name + "\n")
		for i, a := range tc.ci.failedAttrs(tc.err) {
			if i > 0 {
				got.WriteByte(' ')
			}
			got.WriteString(a.Key + "=" + a.Value.String())
		}
		got.WriteByte('\n')
	}
	for _, tc := range refused {
		tc.ci.p = p
		l := tc.ci.labels()
		got.WriteString("# connection complete with an error: " + tc.name + "\n")
		for _, a := range tc.ci.attrs(&l, true) {
			v := a.Value.String()
			if a.Key == "duration" {
				v = "<ms>"
			}
			got.WriteString(a.Key + "=" + v + " ")
		}
		got.WriteString("error=" + tc.err.Error() + "\n")
	}
	const path = "testdata/accesslog.golden"
	if *updateGolden {
		if err := os.WriteFile(path, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	gl, wl := strings.Split(got.String(), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(gl), len(wl)) {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Errorf("line %d:\n got  %s\n want %s", i+1, g, w)
		}
	}
}
