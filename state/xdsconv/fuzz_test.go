package xdsconv

import (
	"net/netip"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel/api/securityapi"
	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/xdsclient"
)

func mustMarshal(f *testing.F, m proto.Message) []byte {
	f.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzAddress decodes arbitrary bytes as an Address, converts it, and
// applies it twice (over itself, so that address conflicts and replacement
// run too). Whatever converts must build into a snapshot: the converter's
// checks must cover the snapshot's.
func FuzzAddress(f *testing.F) {
	length := uint32(24)
	seeds := []proto.Message{
		wlAddr("Kubernetes//Pod/ns/p", "10.0.0.1", withServices("ns/web.ns.svc")),
		svcAddr("web", "10.96.0.1"),
		&workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
			Uid: "u", Addresses: [][]byte{netip.MustParseAddr("fd00::1").AsSlice()}, Capacity: wrapperspb.UInt32(3),
			Waypoint:          &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "n", Hostname: "h"}}},
			ApplicationTunnel: &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_PROXY, Port: 1},
			Locality:          &workloadapi.Locality{Region: "r"},
			NetworkMode:       workloadapi.NetworkMode_HOST_NETWORK,
		}}},
		&workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Hostname:          "h",
			Addresses:         []*workloadapi.NetworkAddress{{Address: []byte{10, 0, 0, 0}, Length: &length}},
			LoadBalancing:     &workloadapi.LoadBalancing{RoutingPreference: []workloadapi.LoadBalancing_Scope{1, 6}, Mode: 2, HealthPolicy: 1},
			WeightedWaypoints: []*workloadapi.WeightedWaypoint{{Destination: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: []byte{1, 2, 3, 4}}}}}},
		}}},
	}
	for _, m := range seeds {
		fuzzseed.Add(f, mustMarshal(f, m))
	}
	fuzzseed.Add(f, []byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		a := &workloadapi.Address{}
		if proto.Unmarshal(data, a) != nil {
			return
		}
		_, _, convErr := ConvertAddress(a)
		x, err := NewXDSState(state.NewStore(nil), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := xdsclient.Resource{Name: "r", Value: &anypb.Any{Value: data}}
		for range 2 {
			rej := x.HandleAddresses(&xdsclient.Update{TypeURL: AddressType, Resources: []xdsclient.Resource{r}})
			if (convErr == nil) != (len(rej) == 0) {
				t.Fatalf("conversion error %v, but rejections %v", convErr, rej)
			}
		}
	})
}

// FuzzAuthorization does the same for Authorization resources, and also
// evaluates the converted policy.
func FuzzAuthorization(f *testing.F) {
	seeds := []proto.Message{
		&securityapi.Authorization{Name: "p", Namespace: "ns", Scope: securityapi.Scope_NAMESPACE, Action: securityapi.Action_DENY,
			Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{
				NotPrincipals:    []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Presence{Presence: &emptypb.Empty{}}}},
				SourceIps:        []*securityapi.Address{{Address: []byte{10, 0, 0, 0}, Length: 8}},
				DestinationPorts: []uint32{80},
				ServiceAccounts:  []*securityapi.ServiceAccountMatch{{Namespace: "a", ServiceAccount: "b"}},
			}}}}}}},
		&securityapi.Authorization{Name: "g"},
	}
	for _, m := range seeds {
		fuzzseed.Add(f, mustMarshal(f, m))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p := &securityapi.Authorization{}
		if proto.Unmarshal(data, p) != nil {
			return
		}
		_, convErr := ConvertAuthorization(p)
		store := state.NewStore(nil)
		x, err := NewXDSState(store, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		rej := x.HandleAuthorizations(&xdsclient.Update{TypeURL: AuthorizationType, Resources: []xdsclient.Resource{
			{Name: "r", Value: &anypb.Any{Value: data}},
		}})
		if (convErr == nil) != (len(rej) == 0) {
			t.Fatalf("conversion error %v, but rejections %v", convErr, rej)
		}
		if convErr == nil {
			store.Load().Authorize(state.Conn{DstWorkload: &state.Workload{Labels: &state.WorkloadLabels{Namespace: p.GetNamespace()}}})
		}
	})
}
