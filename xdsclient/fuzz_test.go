package xdsclient

import (
	"errors"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

// FuzzHandleResponse decodes arbitrary bytes as a DeltaDiscoveryResponse,
// as the control plane's stream delivers them, and applies it to a client
// with one registered type. The reply always answers the response's nonce
// and type; it is an ACK exactly when nothing was rejected; and no rejected
// resource is recorded as held (so a reconnect asks for it again).
func FuzzHandleResponse(f *testing.F) {
	const typeURL = "type.googleapis.com/google.protobuf.StringValue"
	str := func(s string) *anypb.Any {
		a, err := anypb.New(wrapperspb.String(s))
		if err != nil {
			f.Fatal(err)
		}
		return a
	}
	for _, r := range []*discoveryv3.DeltaDiscoveryResponse{
		{TypeUrl: typeURL, Nonce: "1", SystemVersionInfo: "v1", Resources: []*discoveryv3.Resource{
			{Name: "a", Version: "1", Resource: str("x")}, {Name: "b", Version: "2", Resource: str("y")},
		}},
		{TypeUrl: typeURL, Nonce: "2", Resources: []*discoveryv3.Resource{{Name: "bad-c", Version: "1", Resource: str("z")}, {Name: "d"}},
			RemovedResources: []string{"a", "e"}},
		{TypeUrl: typeURL, Nonce: "3", Resources: []*discoveryv3.Resource{{Name: "a", Resource: &anypb.Any{TypeUrl: typeURL, Value: []byte{0xff}}}}},
		{TypeUrl: "type.googleapis.com/unknown", Nonce: "4", Resources: []*discoveryv3.Resource{{Name: "a", Resource: str("x")}}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		fuzzseed.Add(f, b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r discoveryv3.DeltaDiscoveryResponse
		if proto.Unmarshal(data, &r) != nil {
			return
		}
		c := New(Config{})
		var rejected []Rejection
		c.Register(typeURL, HandlerFunc(func(u *Update) []Rejection {
			var rej []Rejection
			for _, res := range u.Resources {
				if res.Value == nil {
					t.Fatalf("resource %q handed over without a value", res.Name)
				}
				var s wrapperspb.StringValue
				if err := res.Value.UnmarshalTo(&s); err != nil {
					rej = append(rej, Rejection{Name: res.Name, Err: err})
				} else if strings.HasPrefix(res.Name, "bad") {
					rej = append(rej, Rejection{Name: res.Name, Err: errFuzzRejected})
				}
			}
			rejected = append(rejected, rej...)
			return rej
		}))
		reply, ack := c.handle(&r)
		if reply.ResponseNonce != r.Nonce || reply.TypeUrl != r.TypeUrl {
			t.Fatalf("reply for %q/%q answers %q/%q", r.TypeUrl, r.Nonce, reply.TypeUrl, reply.ResponseNonce)
		}
		if ack != (reply.ErrorDetail == nil) {
			t.Fatalf("ack %v with error detail %v", ack, reply.ErrorDetail)
		}
		if r.TypeUrl != typeURL {
			if !ack {
				t.Fatal("NACK of a type nobody asked for")
			}
			return
		}
		missing := 0
		for _, res := range r.Resources {
			if res.GetResource() == nil {
				missing++
			}
		}
		if ack != (len(rejected) == 0 && missing == 0) {
			t.Fatalf("ack %v with %d rejected and %d without payload", ack, len(rejected), missing)
		}
		for _, rj := range rejected {
			if c.known[typeURL] != nil && c.known[typeURL].has(rj.Name) {
				t.Fatalf("rejected %q recorded as held", rj.Name)
			}
		}
	})
}

var errFuzzRejected = errors.New("rejected by the fuzz handler")

// FuzzNewNode builds the node from environments, one KEY=value per line
// (ISTIO_METAJSON_* values are JSON documents). Whatever the environment
// holds, the node must encode, or no request could ever be sent; a
// METAJSON value is either in the metadata or reported as skipped.
func FuzzNewNode(f *testing.F) {
	for _, env := range []string{
		"INSTANCE_IP=10.0.0.9\nPOD_NAME=ztunnel-abc\nPOD_NAMESPACE=istio-system\nNODE_NAME=node-1",
		"ISTIO_METAJSON_LABELS={\"app\":\"ztunnel\",\"n\":1}\nISTIO_METAJSON_BAD={",
		"ISTIO_METAJSON_X=[1,2,{\"a\":null}]\nISTIO_METAJSON_Y=\"s\"",
	} {
		fuzzseed.Add(f, env)
	}
	f.Fuzz(func(t *testing.T, env string) {
		info := NodeInfoFromEnv(strings.Split(env, "\n"), map[string]string{"ISTIO_VERSION": "1.27.0"})
		node, skipped := NewNode(info)
		if _, err := proto.Marshal(node); err != nil {
			t.Fatalf("node does not encode: %v", err)
		}
		if got := len(node.GetMetadata().GetFields()); got > 5+len(info.MetaJSON) {
			t.Fatalf("%d metadata fields from %d documents", got, len(info.MetaJSON))
		}
		for k := range info.MetaJSON {
			_, in := node.GetMetadata().GetFields()[k]
			if !in && len(skipped) == 0 {
				t.Fatalf("ISTIO_METAJSON_%s neither applied nor reported", k)
			}
		}
	})
}
