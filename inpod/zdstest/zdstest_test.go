package zdstest

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/api/zdsapi"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeDaemon is the other end: hello, then Ack everything, recording what
// came (and closing the descriptors).
func fakeDaemon(t *testing.T, path string) (got chan string, done chan struct{}) {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	hello, _ := proto.Marshal(&zdsapi.ZdsHello{Version: zdsapi.Version_V1})
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	got, done = make(chan string, 16), make(chan struct{})
	go func() {
		defer close(done)
		defer c.Close()
		buf, oob := make([]byte, 1024), make([]byte, 64)
		for {
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil || n == 0 {
				return
			}
			var req zdsapi.WorkloadRequest
			if err := proto.Unmarshal(buf[:n], &req); err != nil {
				return
			}
			desc := "?"
			switch p := req.Payload.(type) {
			case *zdsapi.WorkloadRequest_Add:
				desc = "add " + p.Add.GetUid()
			case *zdsapi.WorkloadRequest_Del:
				desc = "del " + p.Del.GetUid()
			case *zdsapi.WorkloadRequest_Keep:
				desc = "keep " + p.Keep.GetUid()
			case *zdsapi.WorkloadRequest_SnapshotSent:
				desc = "snapshot"
			}
			if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					fds, _ := unix.ParseUnixRights(&m)
					for _, fd := range fds {
						desc += " +fd"
						unix.Close(fd)
					}
				}
			}
			got <- desc
			ack, _ := proto.Marshal(&zdsapi.WorkloadResponse{Payload: &zdsapi.WorkloadResponse_Ack{Ack: &zdsapi.Ack{}}})
			if _, err := c.Write(ack); err != nil {
				return
			}
		}
	}()
	return got, done
}

func TestReplayThenLiveUpdates(t *testing.T) {
	s, err := Start(Config{Path: filepath.Join(t.TempDir(), "zds.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Add(Pod{UID: "a", Name: "a", NetnsPath: "/proc/self/ns/net"}); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("Add with no daemon: %v, want ErrNotConnected", err)
	}
	s.Add(Pod{UID: "b", Name: "b", Keep: true})
	got, done := fakeDaemon(t, s.Path())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.WaitSnapshots(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"add a +fd", "keep b", "snapshot"} {
		if g := <-got; g != want {
			t.Fatalf("replay: got %q, want %q", g, want)
		}
	}
	if ack, err := s.Del("a"); err != nil || ack != "" {
		t.Fatalf("Del: %q %v", ack, err)
	}
	if g := <-got; g != "del a" {
		t.Fatalf("got %q, want del a", g)
	}
	if n := len(s.Pods()); n != 1 {
		t.Fatalf("%d pods known after Del, want 1", n)
	}
	if ev := s.Events(); len(ev) != 4 || len(s.Nacks()) != 0 {
		t.Fatalf("events %+v", ev)
	}
	s.CloseConns()
	<-done
}
