package xdsclient_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel/xdsclient"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Two type URLs of real messages, standing in for Address and Authorization:
// the client is generic, so any message will do.
const (
	typeA = "type.googleapis.com/google.protobuf.StringValue"
	typeB = "type.googleapis.com/google.protobuf.UInt32Value"
)

// waitLimit guards against hangs; it is not a timing assertion.
const waitLimit = 10 * time.Second

// store is a Handler that keeps what it accepted: name -> decoded value. It
// rejects names listed in reject, and values that do not decode.
type store struct {
	mu      sync.Mutex
	values  map[string]string
	updates []*xdsclient.Update
	reject  map[string]string // name -> reason
	changed chan struct{}
}

func newStore() *store {
	return &store{values: map[string]string{}, reject: map[string]string{}, changed: make(chan struct{}, 100)}
}

func (s *store) Handle(u *xdsclient.Update) []xdsclient.Rejection {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updates = append(s.updates, u)
	var rej []xdsclient.Rejection
	for _, r := range u.Resources {
		if reason, bad := s.reject[r.Name]; bad {
			rej = append(rej, xdsclient.Rejection{Name: r.Name, Err: errors.New(reason)})
			continue
		}
		m, err := r.Value.UnmarshalNew()
		if err != nil {
			rej = append(rej, xdsclient.Rejection{Name: r.Name, Err: err})
			continue
		}
		switch v := m.(type) {
		case *wrapperspb.StringValue:
			s.values[r.Name] = v.Value
		case *wrapperspb.UInt32Value:
			s.values[r.Name] = string(rune('0' + v.Value%10))
		}
	}
	for _, n := range u.Removed {
		delete(s.values, n)
	}
	s.changed <- struct{}{}
	return rej
}

func (s *store) snapshot() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.values)
}

func (s *store) setReject(name, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reject[name] = reason
}

func (s *store) waitUpdate(t *testing.T) {
	t.Helper()
	select {
	case <-s.changed:
	case <-time.After(waitLimit):
		t.Fatal("no update applied")
	}
}

// rig runs a client against a kit server.
type rig struct {
	srv    *xdstest.Server
	client *xdsclient.Client
	a, b   *store
	errc   chan error
	cancel context.CancelFunc
}

func newRig(t *testing.T, srv *xdstest.Server, mod func(*xdsclient.Config)) *rig {
	t.Helper()
	node, _ := xdsclient.NewNode(xdsclient.NodeInfo{
		InstanceIP: "10.0.0.9", PodName: "ztunnel-abc", PodNamespace: "istio-system", NodeName: "node1",
	})
	cfg := xdsclient.Config{
		Address: srv.Address(),
		RootCA:  srv.TLS().RootFile,
		Node:    node,
		Logf:    func(l slog.Level, f string, a ...any) { t.Logf(l.String()+" "+f, a...) },
	}
	if mod != nil {
		mod(&cfg)
	}
	r := &rig{srv: srv, client: xdsclient.New(cfg), a: newStore(), b: newStore(), errc: make(chan error, 1)}
	r.client.Register(typeA, r.a)
	r.client.Register(typeB, r.b)
	return r
}

// start runs the client until the test ends.
func (r *rig) start(t *testing.T) *rig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.errc <- r.client.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.errc; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	})
	return r
}

func (r *rig) waitSynced(t *testing.T) {
	t.Helper()
	select {
	case <-r.client.Synced():
	case <-time.After(waitLimit):
		t.Fatal("client did not sync")
	}
}

func str(s string) proto.Message { return wrapperspb.String(s) }

func isAckOf(typeURL string) func(*xdstest.Request) bool {
	return func(r *xdstest.Request) bool { return r.TypeUrl == typeURL && r.ResponseNonce != "" }
}

func TestInitialSync(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Set(typeA, "a1", "v1", str("one"))
	srv.Set(typeA, "a2", "v1", str("two"))
	srv.Set(typeB, "b1", "v1", wrapperspb.UInt32(7))
	r := newRig(t, srv, nil).start(t)

	// One initial request per type, in registration order, each with the
	// node, a wildcard subscription and nothing held yet.
	for _, want := range []string{typeA, typeB} {
		req := srv.NextRequest()
		if req.TypeUrl != want || req.ResponseNonce != "" {
			t.Fatalf("request %v, want the initial request for %s", req, want)
		}
		if got := req.Node.GetId(); got != "ztunnel~10.0.0.9~ztunnel-abc.istio-system~istio-system.svc.cluster.local" {
			t.Errorf("node id %q", got)
		}
		md := req.Node.GetMetadata().AsMap()
		for k, v := range map[string]any{"NAME": "ztunnel-abc", "NAMESPACE": "istio-system", "INSTANCE_IPS": "10.0.0.9", "NODE_NAME": "node1"} {
			if md[k] != v {
				t.Errorf("node metadata %s = %v, want %v", k, md[k], v)
			}
		}
		if len(req.ResourceNamesSubscribe)+len(req.ResourceNamesUnsubscribe)+len(req.InitialResourceVersions) != 0 {
			t.Errorf("initial request for %s is not a bare wildcard: %v", want, req)
		}
	}
	r.waitSynced(t)
	for _, typ := range []string{typeA, typeB} {
		ack := srv.WaitRequest(isAckOf(typ))
		if !ack.IsAck() || ack.Node != nil {
			t.Errorf("reply for %s: %v, want a plain ACK", typ, ack)
		}
	}
	if got, want := r.a.snapshot(), map[string]string{"a1": "one", "a2": "two"}; !maps.Equal(got, want) {
		t.Errorf("type A holds %v, want %v", got, want)
	}
	if got := r.b.snapshot(); got["b1"] != "7" || len(got) != 1 {
		t.Errorf("type B holds %v", got)
	}
}

func TestAddUpdateRemove(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Set(typeA, "a1", "v1", str("one"))
	r := newRig(t, srv, nil).start(t)
	r.waitSynced(t)

	steps := []struct {
		name string
		do   func()
		want map[string]string
	}{
		{"add", func() { srv.Set(typeA, "a2", "v1", str("two")) }, map[string]string{"a1": "one", "a2": "two"}},
		{"update", func() { srv.Set(typeA, "a1", "v2", str("uno")) }, map[string]string{"a1": "uno", "a2": "two"}},
		{"remove", func() { srv.Remove(typeA, "a2") }, map[string]string{"a1": "uno"}},
		{"batch", func() {
			srv.Update(typeA, []*discoveryv3.Resource{
				xdstest.NewResource(t, "a3", "v1", str("three")), xdstest.NewResource(t, "a4", "v1", str("four")),
			}, []string{"a1"})
		}, map[string]string{"a3": "three", "a4": "four"}},
	}
	// Drain the initial responses' updates.
	for len(r.a.changed) > 0 {
		<-r.a.changed
	}
	for _, st := range steps {
		st.do()
		r.a.waitUpdate(t)
		if ack := srv.WaitRequest(isAckOf(typeA)); !ack.IsAck() {
			t.Errorf("%s: reply %v, want ACK", st.name, ack)
		}
		if got := r.a.snapshot(); !maps.Equal(got, st.want) {
			t.Errorf("%s: holds %v, want %v", st.name, got, st.want)
		}
	}
}

func TestNackNamesRejectedAndAppliesTheRest(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	r := newRig(t, srv, nil).start(t)
	r.waitSynced(t)
	r.a.setReject("bad1", "tunnel protocol not supported")

	srv.Update(typeA, []*discoveryv3.Resource{
		xdstest.NewResource(t, "good", "v1", str("fine")),
		xdstest.NewResource(t, "bad1", "v1", str("x")),
		{Name: "bad2", Version: "v1"},                                                            // no payload
		{Name: "bad3", Version: "v1", Resource: &anypb.Any{TypeUrl: typeA, Value: []byte{0xff}}}, // does not decode
	}, nil)
	nack := srv.WaitRequest(isAckOf(typeA))
	for !nack.IsNack() {
		nack = srv.WaitRequest(isAckOf(typeA))
	}
	// Each rejected resource is named: the handler's first, then those
	// without a payload.
	parts := strings.Split(nack.ErrorDetail.GetMessage(), "; ")
	if len(parts) != 3 || parts[0] != "bad1: tunnel protocol not supported" ||
		!strings.HasPrefix(parts[1], "bad3: ") || parts[2] != "bad2: xds payload without resource" {
		t.Errorf("error_detail %q", nack.ErrorDetail.GetMessage())
	}
	if got := r.a.snapshot(); got["good"] != "fine" || got["bad3"] != "" {
		t.Errorf("holds %v, want good applied", got)
	}
}

func TestSyncedWaitsForAnAck(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Set(typeA, "a1", "v1", str("one"))
	srv.Set(typeB, "bad", "v1", wrapperspb.UInt32(1))
	r := newRig(t, srv, nil)
	r.b.setReject("bad", "no")
	r.start(t)
	// B's first response is NACKed: not synced.
	nack := srv.WaitRequest(func(q *xdstest.Request) bool { return q.TypeUrl == typeB && q.ResponseNonce != "" })
	if !nack.IsNack() {
		t.Fatalf("first reply for B %v, want NACK", nack)
	}
	select {
	case <-r.client.Synced():
		t.Fatal("synced after a NACK")
	default:
	}
	// A good resource for B is ACKed: synced.
	srv.Set(typeB, "good", "v1", wrapperspb.UInt32(2))
	r.waitSynced(t)
}

// A type the server does not answer yet keeps the client unsynced, however
// complete the other types are (the daemon serves nothing until Synced).
func TestSyncedWaitsForAWithheldType(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Set(typeA, "a1", "v1", str("one"))
	srv.Set(typeB, "b1", "v1", wrapperspb.UInt32(1))
	srv.Withhold(typeB)
	r := newRig(t, srv, nil)
	r.start(t)
	// Requests are consumed in arrival order: B's subscription comes
	// before A's ACK.
	srv.WaitRequest(func(q *xdstest.Request) bool { return q.TypeUrl == typeB })
	srv.WaitRequest(func(q *xdstest.Request) bool { return q.TypeUrl == typeA && q.IsAck() })
	select {
	case <-r.client.Synced():
		t.Fatal("synced while B was withheld")
	default:
	}
	srv.Release(typeB)
	r.waitSynced(t)
}

func TestResumeAfterRestart(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Set(typeA, "a1", "v1", str("one"))
	srv.Set(typeA, "a2", "v7", str("two"))
	srv.Set(typeB, "b1", "v3", wrapperspb.UInt32(1))
	r := newRig(t, srv, nil)
	r.a.setReject("rejected", "bad")
	r.start(t)
	r.waitSynced(t)
	srv.Set(typeA, "rejected", "v1", str("x"))
	if nack := srv.WaitRequest(isAckOf(typeA)); !nack.IsNack() {
		for !nack.IsNack() {
			nack = srv.WaitRequest(isAckOf(typeA))
		}
	}

	srv.Restart()
	for _, tc := range []struct {
		typ  string
		want map[string]string
	}{
		// The rejected resource is left out so that the server sends it again.
		{typeA, map[string]string{"a1": "v1", "a2": "v7"}},
		{typeB, map[string]string{"b1": "v3"}},
	} {
		req := srv.WaitRequest(func(q *xdstest.Request) bool { return q.Stream == 2 && q.TypeUrl == tc.typ && q.ResponseNonce == "" })
		if !maps.Equal(req.InitialResourceVersions, tc.want) {
			t.Errorf("%s: initial_resource_versions %v, want %v", tc.typ, req.InitialResourceVersions, tc.want)
		}
		if req.Node.GetId() == "" {
			t.Errorf("%s: resumed request has no node", tc.typ)
		}
	}
	// Only the rejected resource is sent again.
	srv.WaitRequest(func(q *xdstest.Request) bool { return q.Stream == 2 && q.TypeUrl == typeA && q.ResponseNonce != "" })
	r.a.mu.Lock()
	last := r.a.updates[len(r.a.updates)-1]
	r.a.mu.Unlock()
	var names []string
	for _, res := range last.Resources {
		names = append(names, res.Name)
	}
	if !slices.Equal(names, []string{"rejected"}) || len(last.Removed) != 0 {
		t.Errorf("after resume the server sent %v (removed %v), want only the rejected resource", names, last.Removed)
	}
}

func TestCleanEndReconnects(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Set(typeA, "a1", "v1", str("one"))
	r := newRig(t, srv, nil).start(t)
	r.waitSynced(t)
	srv.CloseStreams()
	req := srv.WaitRequest(func(q *xdstest.Request) bool { return q.Stream == 2 && q.TypeUrl == typeA })
	if got := req.InitialResourceVersions; !maps.Equal(got, map[string]string{"a1": "v1"}) {
		t.Errorf("initial_resource_versions %v", got)
	}
	// A change after the reconnection arrives on the new stream.
	srv.Set(typeA, "a2", "v1", str("two"))
	srv.WaitRequest(func(q *xdstest.Request) bool { return q.Stream == 2 && q.IsAck() && q.TypeUrl == typeA })
	for r.a.snapshot()["a2"] == "" {
		r.a.waitUpdate(t)
	}
}

func TestAuthHeaders(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	tok := filepath.Join(t.TempDir(), "istio-token")
	if err := os.WriteFile(tok, []byte("jwt-one"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, srv, func(c *xdsclient.Config) {
		c.TokenPath = tok
		c.ClusterID = "cluster-7"
		c.Headers = map[string]string{"X-Extra": "yes"}
	}).start(t)
	r.waitSynced(t)
	req := srv.AllRequests()[0]
	for k, want := range map[string]string{"authorization": "Bearer jwt-one", "clusterid": "cluster-7", "x-extra": "yes"} {
		if got := req.Metadata.Get(k); !slices.Equal(got, []string{want}) {
			t.Errorf("header %s = %v, want %q", k, got, want)
		}
	}
	// A rotated token is used by the next stream.
	if err := os.WriteFile(tok, []byte("jwt-two"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.CloseStreams()
	req = srv.WaitRequest(func(q *xdstest.Request) bool { return q.Stream == 2 })
	if got := req.Metadata.Get("authorization"); !slices.Equal(got, []string{"Bearer jwt-two"}) {
		t.Errorf("after rotation authorization = %v", got)
	}
}

func TestAltHostname(t *testing.T) {
	// The certificate names istiod only; the client dials 127.0.0.1.
	srv := xdstest.NewServer(t, xdstest.Options{ServerNames: []string{"istiod.istio-system.svc"}})
	srv.Set(typeB, "b1", "v1", wrapperspb.UInt32(1))
	r := newRig(t, srv, func(c *xdsclient.Config) { c.AltHostname = "istiod.istio-system.svc" }).start(t)
	r.waitSynced(t)
}

func TestRunRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]xdsclient.Config{
		"no address":  {},
		"plain http":  {Address: "http://127.0.0.1:1"},
		"garbage PEM": {Address: "https://127.0.0.1:1", RootCA: "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"},
	} {
		t.Run(name, func(t *testing.T) {
			c := xdsclient.New(cfg)
			c.Register(typeA, newStore())
			if err := c.Run(context.Background()); err == nil || errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v, want a configuration error", err)
			}
		})
	}
	c := xdsclient.New(xdsclient.Config{Address: "https://127.0.0.1:1"})
	if err := c.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "no handler") {
		t.Errorf("Run without handlers = %v", err)
	}
}

func TestNewNode(t *testing.T) {
	info := xdsclient.NodeInfoFromEnv([]string{
		"POD_NAME=zt-1", "POD_NAMESPACE=istio-system", "NODE_NAME=n1",
		`ISTIO_METAJSON_LABELS={"app":"ztunnel","n":2}`, "ISTIO_METAJSON_BAD={", "UNRELATED=x",
	}, map[string]string{"CLUSTER_ID": "c1", "NAME": "overridden"})
	node, skipped := xdsclient.NewNode(info)
	if node.Id != "ztunnel~1.1.1.1~zt-1.istio-system~istio-system.svc.cluster.local" {
		t.Errorf("id %q", node.Id)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0].Error(), "ISTIO_METAJSON_BAD") {
		t.Errorf("skipped %v", skipped)
	}
	want, _ := structpb.NewStruct(map[string]any{
		"NAME": "overridden", "NAMESPACE": "istio-system", "INSTANCE_IPS": "1.1.1.1", "NODE_NAME": "n1",
		"CLUSTER_ID": "c1", "LABELS": map[string]any{"app": "ztunnel", "n": 2.0},
	})
	if !proto.Equal(node.Metadata, want) {
		t.Errorf("metadata %v, want %v", node.Metadata, want)
	}
}

// TestMetricFeeders: every response reaches OnMessage with its type and
// resource bytes, and a stream the server ends reaches OnTermination.
func TestMetricFeeders(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Set(typeA, "a1", "v1", str("one"))
	var (
		mu     sync.Mutex
		msgs   = map[string]int{}
		bytes  = map[string]int{}
		ended  []string
		endedc = make(chan struct{}, 8)
	)
	r := newRig(t, srv, func(c *xdsclient.Config) {
		c.OnMessage = func(typeURL string, n int) {
			mu.Lock()
			msgs[typeURL]++
			bytes[typeURL] += n
			mu.Unlock()
		}
		c.OnTermination = func(reason string) {
			mu.Lock()
			ended = append(ended, reason)
			mu.Unlock()
			endedc <- struct{}{}
		}
	}).start(t)
	r.waitSynced(t)
	srv.CloseStreams()
	select {
	case <-endedc:
	case <-time.After(waitLimit):
		t.Fatal("no termination reported")
	}
	srv.WaitRequest(func(q *xdstest.Request) bool { return q.Stream == 2 && q.IsAck() && q.TypeUrl == typeA })
	mu.Lock()
	defer mu.Unlock()
	want, _ := proto.Marshal(str("one"))
	if msgs[typeA] < 1 || bytes[typeA] < len(want) || msgs[typeB] < 1 {
		t.Errorf("messages %v, bytes %v; want at least one of each type and %d bytes of %s", msgs, bytes, len(want), typeA)
	}
	if len(ended) != 1 || ended[0] != xdsclient.TerminationComplete {
		t.Errorf("terminations %v, want [Complete]", ended)
	}
}
