package inpod

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/api/zdsapi"
	"github.com/ztunnel-go/ztunnel/inpod/zdstest"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

func addReq(uid string) *zdsapi.WorkloadRequest {
	return &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{
		Uid: uid, WorkloadInfo: &zdsapi.WorkloadInfo{Name: "name-" + uid, Namespace: "ns", ServiceAccount: "sa"},
	}}}
}

func keepReq(uid string) *zdsapi.WorkloadRequest {
	return &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Keep{Keep: &zdsapi.KeepWorkload{Uid: uid}}}
}

func delReq(uid string) *zdsapi.WorkloadRequest {
	return &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Del{Del: &zdsapi.DelWorkload{Uid: uid}}}
}

func snapReq() *zdsapi.WorkloadRequest {
	return &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_SnapshotSent{SnapshotSent: &zdsapi.SnapshotSent{}}}
}

// openOwn opens the test process's own netns (no root needed).
func openOwn(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// send sends a request and fails the test unless the response is wantNack
// ("" = Ack; otherwise a substring of the Nack).
func send(t *testing.T, c *zdstest.Conn, req *zdsapi.WorkloadRequest, ns *os.File, wantNack string) {
	t.Helper()
	ack, err := c.Send(req, ns)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case wantNack == "" && ack != "":
		t.Fatalf("%v: Nack %q, want Ack", req, ack)
	case wantNack != "" && !strings.Contains(ack, wantNack):
		t.Fatalf("%v: response %q, want a Nack with %q", req, ack, wantNack)
	}
}

func TestSnapshotThenReady(t *testing.T) {
	r := newRig(t, nil)
	c := r.accept()
	if r.ready.ready() {
		t.Fatal("ready before the snapshot")
	}
	send(t, c, addReq("a"), openOwn(t), "")
	send(t, c, addReq("b"), openOwn(t), "")
	if r.ready.ready() {
		t.Fatal("ready before SnapshotSent")
	}
	send(t, c, snapReq(), nil, "")
	if !r.ready.ready() {
		t.Fatal("not ready after the snapshot with nothing pending")
	}
	st := r.mgr.WorkloadState()
	want := WorkloadState{Info: WorkloadInfo{Name: "name-a", Namespace: "ns", ServiceAccount: "sa"}, State: StateUp}
	if a := st["a"]; len(st) != 2 || a.Info != want.Info || a.State != want.State || a.Proxy == nil {
		t.Fatalf("workload state %+v, want %+v with its running proxy", st, want)
	}
	for _, p := range r.fac.all() {
		if !p.wasStarted() || p.pod.Netns == nil {
			t.Fatalf("proxy %s not started with a netns", p.pod.UID)
		}
	}

	// Live Add and Del after the snapshot.
	send(t, c, addReq("c"), openOwn(t), "")
	send(t, c, delReq("a"), nil, "")
	eventually(t, "a's proxy closed", func() bool { return r.fac.all()[0].isEnded() })
	eventually(t, "deleted pod gone from workload state", func() bool {
		_, ok := r.mgr.WorkloadState()["a"]
		return !ok
	})
	// Del of an unknown pod is acked (idempotent).
	send(t, c, delReq("nope"), nil, "")

	// Disconnect: not ready until the next snapshot.
	c.Close()
	c2 := r.accept()
	eventually(t, "not ready after disconnect", func() bool { return !r.ready.ready() })
	send(t, c2, addReq("b"), openOwn(t), "")
	send(t, c2, snapReq(), nil, "")
	if !r.ready.ready() {
		t.Fatal("not ready after the second snapshot")
	}
	// c was not replayed: reconcile closed it; b was kept (same netns, no
	// new proxy).
	ps := r.fac.all()
	if len(ps) != 3 {
		t.Fatalf("%d proxies built, want 3 (a, b, c; the replayed b is a no-op)", len(ps))
	}
	eventually(t, "c closed by reconcile", func() bool { return ps[2].isEnded() })
	if ps[1].isEnded() {
		t.Fatal("b closed although replayed")
	}
}

func TestAddSameNetnsIsNoopNewNetnsReplaces(t *testing.T) {
	requireRoot(t)
	r := newRig(t, nil)
	c := r.accept()
	ns1, ns2 := newNetns(t), newNetns(t)
	send(t, c, addReq("a"), ns1, "")
	send(t, c, addReq("a"), ns1, "")
	if n := len(r.fac.all()); n != 1 {
		t.Fatalf("%d proxies after the same Add twice, want 1", n)
	}
	send(t, c, addReq("a"), ns2, "")
	ps := r.fac.all()
	if len(ps) != 2 {
		t.Fatalf("%d proxies after an Add with a new netns, want 2", len(ps))
	}
	eventually(t, "old proxy closed", ps[0].isEnded)
	if ps[1].isEnded() {
		t.Fatal("new proxy closed")
	}
	if ps[0].pod.Netns.ID() == ps[1].pod.Netns.ID() {
		t.Fatal("both proxies got the same netns")
	}
	if st := r.mgr.WorkloadState()["a"]; st.State != StateUp {
		t.Fatalf("state after replace %+v, want Up (the old proxy's end must not erase it)", st)
	}
}

// TestAddDeleteAddOneProxy is ztunnel's
// add_delete_add_workload_starts_only_one_proxy: after a snapshot, an Add,
// its Delete and an Add of the same pod in the same netns leave exactly
// one proxy running, the second one, with the pod Up.
func TestAddDeleteAddOneProxy(t *testing.T) {
	r := newRig(t, nil)
	c := r.accept()
	send(t, c, snapReq(), nil, "")
	// Both Adds name the same netns (the test's own), opened twice as the
	// CNI agent would send it twice.
	send(t, c, addReq("a"), openOwn(t), "")
	send(t, c, delReq("a"), nil, "")
	ps := r.fac.all()
	if len(ps) != 1 {
		t.Fatalf("%d proxies after Add and Delete, want 1", len(ps))
	}
	eventually(t, "deleted proxy ended", ps[0].isEnded)
	if _, ok := r.mgr.WorkloadState()["a"]; ok {
		t.Fatal("the deleted pod is still in the workload state")
	}
	send(t, c, addReq("a"), openOwn(t), "")
	ps = r.fac.all()
	if len(ps) != 2 {
		t.Fatalf("%d proxies made after add, delete, add; want 2", len(ps))
	}
	var live []*fakeProxy
	for _, p := range ps {
		if !p.isEnded() {
			live = append(live, p)
		}
	}
	if len(live) != 1 || live[0] != ps[1] || !ps[1].wasStarted() {
		t.Fatalf("%d proxies running, want one: the second, started", len(live))
	}
	if st := r.mgr.WorkloadState()["a"]; st.State != StateUp || st.Proxy != Proxy(ps[1]) {
		t.Fatalf("state %+v, want Up with the second proxy", st)
	}
}

func TestFailedStartIsPendingAndRetried(t *testing.T) {
	r := newRig(t, func(c *Config) { c.RetryInterval = 20 * time.Millisecond })
	r.fac.failNext("a", 2)
	c := r.accept()
	send(t, c, addReq("a"), openOwn(t), "failure to start proxy")
	if st := r.mgr.WorkloadState()["a"]; st.State != StatePending || st.Proxy != nil {
		t.Fatalf("state %+v, want Pending with no proxy", st)
	}
	send(t, c, snapReq(), nil, "")
	if r.ready.ready() {
		t.Fatal("ready with a pod pending")
	}
	// The stream stays up and the retries (every 20ms here) start it.
	eventually(t, "retry started the proxy", func() bool { return len(r.fac.all()) == 1 })
	eventually(t, "ready once nothing is pending", r.ready.ready)
	if st := r.mgr.WorkloadState()["a"]; st.State != StateUp {
		t.Fatalf("state %+v, want Up", st)
	}
	send(t, c, addReq("b"), openOwn(t), "")
}

func TestDelBeforeSnapshotDropsPending(t *testing.T) {
	r := newRig(t, func(c *Config) { c.RetryInterval = time.Hour })
	r.fac.failNext("a", 1)
	c := r.accept()
	send(t, c, addReq("a"), openOwn(t), "failure to start proxy")
	send(t, c, delReq("a"), nil, "")
	send(t, c, snapReq(), nil, "")
	if !r.ready.ready() {
		t.Fatal("not ready: the deleted pending pod still counts")
	}
	if len(r.mgr.WorkloadState()) != 0 {
		t.Fatalf("workload state %+v, want empty", r.mgr.WorkloadState())
	}
}

func TestKeepBeforeSnapshotKeepsProxy(t *testing.T) {
	r := newRig(t, nil)
	c := r.accept()
	send(t, c, addReq("a"), openOwn(t), "")
	send(t, c, snapReq(), nil, "")
	c.Close()
	c2 := r.accept()
	send(t, c2, keepReq("a"), nil, "")
	send(t, c2, snapReq(), nil, "")
	if r.fac.all()[0].isEnded() {
		t.Fatal("kept pod's proxy was closed")
	}
}

func TestProtocolErrorsAreFatal(t *testing.T) {
	own := func(t *testing.T) *os.File { return openOwn(t) }
	none := func(*testing.T) *os.File { return nil }
	noInfo := &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{Uid: "x"}}}
	tests := []struct {
		name   string
		before []*zdsapi.WorkloadRequest
		bad    *zdsapi.WorkloadRequest
		ns     func(*testing.T) *os.File
		reason string
	}{
		{"keep after snapshot", []*zdsapi.WorkloadRequest{snapReq()}, keepReq("a"), none, "keep received after snapshot"},
		{"second snapshot", []*zdsapi.WorkloadRequest{snapReq()}, snapReq(), none, "snapshot received already"},
		{"add without workload info", nil, noInfo, own, "workload_info is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			c := r.accept()
			for _, req := range tc.before {
				send(t, c, req, nil, "")
			}
			send(t, c, tc.bad, tc.ns(t), tc.reason)
			select {
			case <-r.mgr.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("manager still running after a protocol error")
			}
			var pe *ProtocolError
			if err := r.mgr.Err(); !errors.As(err, &pe) || !strings.Contains(pe.Reason, tc.reason) {
				t.Fatalf("Err() = %v, want a *ProtocolError with %q", err, tc.reason)
			}
			if r.ready.ready() {
				t.Fatal("ready after a protocol error")
			}
		})
	}
}

// TestMalformedPacketsAreNacked sends every kind of broken packet: each is
// Nacked, the stream is reconnected, and the running pod's proxy is never
// touched.
func TestMalformedPacketsAreNacked(t *testing.T) {
	dupOwn := func(t *testing.T) int {
		fd, err := syscallDup(int(openOwn(t).Fd()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	devNull := func(t *testing.T) int {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return int(f.Fd())
	}
	addBytes, _ := proto.Marshal(addReq("z"))
	delBytes, _ := proto.Marshal(delReq("z"))
	tests := []struct {
		name string
		data []byte
		fds  func(t *testing.T) []int
		want string
	}{
		{"garbage", []byte{0xff, 0xff, 0xff, 0xff}, nil, "decode"},
		{"truncated protobuf", addBytes[:len(addBytes)-3], func(t *testing.T) []int { return []int{dupOwn(t)} }, "decode"},
		{"too long for the buffer", append(addBytes, make([]byte, 2000)...), nil, "truncated"},
		{"no payload", nil, nil, ""}, // a zero-length packet reads as end of stream: no response
		{"empty oneof", []byte{0x08, 0x01}, nil, "without payload"},
		{"add without fd", addBytes, nil, "without a netns"},
		{"del with fd", delBytes, func(t *testing.T) []int { return []int{dupOwn(t)} }, "unexpected descriptor"},
		{"two fds", addBytes, func(t *testing.T) []int { return []int{dupOwn(t), dupOwn(t)} }, "descriptor"},
		{"many fds", addBytes, func(t *testing.T) []int { return []int{dupOwn(t), dupOwn(t), dupOwn(t), dupOwn(t)} }, "truncated control"},
		{"fd not a netns", addBytes, func(t *testing.T) []int { return []int{devNull(t)} }, "namespace"},
	}
	r := newRig(t, nil)
	c := r.accept()
	send(t, c, addReq("a"), openOwn(t), "")
	send(t, c, snapReq(), nil, "")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var fds []int
			if tc.fds != nil {
				fds = tc.fds(t)
			}
			if tc.want == "" {
				// A zero-length packet is end of stream to SEQPACKET readers.
				if err := c.SendNoReply(tc.data, fds...); err != nil {
					t.Fatal(err)
				}
			} else {
				ack, err := c.SendRaw(tc.data, fds...)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(ack, tc.want) {
					t.Fatalf("response %q, want a Nack with %q", ack, tc.want)
				}
			}
			// The manager reconnects; the agent replays; a still serves.
			c = r.accept()
			send(t, c, addReq("a"), openOwn(t), "")
			send(t, c, snapReq(), nil, "")
			if ps := r.fac.all(); len(ps) != 1 || ps[0].isEnded() {
				t.Fatalf("pod a's proxy was restarted or closed (%d built)", len(ps))
			}
		})
	}
	if r.mgr.Err() != nil {
		t.Fatalf("manager stopped: %v", r.mgr.Err())
	}
}

func TestReconnectsWhenAgentAppears(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/zds.sock"
	fac := &factory{}
	m, err := New(Config{UDS: path, NewProxy: fac.newProxy, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	defer m.Close()
	time.Sleep(20 * time.Millisecond) // a few failed connects
	srv, err := zdstest.Start(zdstest.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if _, err := srv.Add(zdstest.Pod{UID: "a", Name: "a", Namespace: "ns", NetnsPath: "/proc/self/ns/net"}); err != nil && !errors.Is(err, zdstest.ErrNotConnected) {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitSnapshots(ctx, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "proxy for a", func() bool { return len(fac.all()) == 1 })
}

func TestDrainDrainsEveryProxy(t *testing.T) {
	r := newRig(t, nil)
	c := r.accept()
	send(t, c, addReq("a"), openOwn(t), "")
	send(t, c, addReq("b"), openOwn(t), "")
	send(t, c, snapReq(), nil, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.mgr.Drain(ctx)
	for _, p := range r.fac.all() {
		if !p.isEnded() || !p.wasDrained() {
			t.Fatalf("proxy %s not drained gracefully", p.pod.UID)
		}
	}
	if err := r.mgr.Err(); err != nil {
		t.Fatalf("Err() after drain = %v", err)
	}
	if len(r.mgr.WorkloadState()) != 0 {
		t.Fatal("workload state not empty after drain")
	}
	if err := c.WaitClosed(ctx); err != nil {
		t.Fatalf("stream not closed by drain: %v", err)
	}
	r.mgr.Drain(ctx) // idempotent
}

func TestNewRequiresNewProxy(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without NewProxy succeeded")
	}
	m, err := New(Config{NewProxy: (&factory{}).newProxy})
	if err != nil {
		t.Fatal(err)
	}
	m.Close() // never started
	m.Start() // after Close: must not start
	<-m.Done()
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestNoDescriptorLeak runs adds (kept, replaced, failed, deleted),
// malformed packets with descriptors, a reconnect and a drain, and checks
// that every received netns descriptor was closed.
func TestNoDescriptorLeak(t *testing.T) {
	before := countFDs(t)
	t.Run("scenario", func(t *testing.T) {
		r := newRig(t, func(c *Config) { c.RetryInterval = time.Hour })
		r.fac.failNext("f", 1)
		c := r.accept()
		send(t, c, addReq("a"), openOwn(t), "")
		send(t, c, addReq("a"), openOwn(t), "") // same netns: the duplicate is closed
		send(t, c, addReq("b"), openOwn(t), "")
		send(t, c, addReq("f"), openOwn(t), "failure to start proxy")
		send(t, c, snapReq(), nil, "")
		send(t, c, delReq("b"), nil, "")
		fd, err := syscallDup(int(openOwn(t).Fd()))
		if err != nil {
			t.Fatal(err)
		}
		delBytes, _ := proto.Marshal(delReq("z"))
		ack, err := c.SendRaw(delBytes, fd)
		unix.Close(fd) // ours; the daemon got its own copy
		if err != nil || ack == "" {
			t.Fatalf("del with fd: %q %v", ack, err)
		}
		c = r.accept() // reconnect: the pending f is dropped
		send(t, c, addReq("a"), openOwn(t), "")
		send(t, c, snapReq(), nil, "")
		r.mgr.Close()
	})
	// Descriptors of earlier tests may still be closing when before is
	// counted (their goroutines end after them), so fewer after is no
	// failure; more is a leak, unless a close of ours is still under way.
	after := countFDs(t)
	if !nettest.Until(5*time.Second, func() bool { after = countFDs(t); return after <= before }) {
		t.Fatalf("%d descriptors open before, %d after", before, after)
	}
}
