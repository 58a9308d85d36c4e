package inpod

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/api/zdsapi"
	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ownFD returns a fresh descriptor of this process's netns.
func ownFD(t testing.TB) int {
	t.Helper()
	fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

func isOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return !errors.Is(err, unix.EBADF)
}

func TestDecodeRequest(t *testing.T) {
	devNull := func(t testing.TB) int {
		fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	tests := []struct {
		name    string
		data    []byte
		fds     []func(testing.TB) int
		flags   int
		kind    requestKind
		uid     string
		info    *WorkloadInfo
		wantErr string
	}{
		{name: "add", data: marshal(t, addReq("u1")), fds: []func(testing.TB) int{ownFD}, kind: kindAdd, uid: "u1",
			info: &WorkloadInfo{Name: "name-u1", Namespace: "ns", ServiceAccount: "sa"}},
		{name: "add without info", data: marshal(t, &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{Uid: "u1"}}}),
			fds: []func(testing.TB) int{ownFD}, kind: kindAdd, uid: "u1"},
		{name: "keep", data: marshal(t, keepReq("u2")), kind: kindKeep, uid: "u2"},
		{name: "del", data: marshal(t, delReq("u3")), kind: kindDel, uid: "u3"},
		{name: "snapshot", data: marshal(t, snapReq()), kind: kindSnapshot},
		{name: "add without fd", data: marshal(t, addReq("u1")), wantErr: "without a netns"},
		{name: "add with two fds", data: marshal(t, addReq("u1")), fds: []func(testing.TB) int{ownFD, ownFD}, wantErr: "expected 1 descriptor"},
		{name: "add with a file", data: marshal(t, addReq("u1")), fds: []func(testing.TB) int{devNull}, wantErr: "not a namespace"},
		{name: "keep with fd", data: marshal(t, keepReq("u2")), fds: []func(testing.TB) int{ownFD}, wantErr: "unexpected descriptor"},
		{name: "snapshot with fd", data: marshal(t, snapReq()), fds: []func(testing.TB) int{ownFD}, wantErr: "unexpected descriptor"},
		{name: "truncated", data: marshal(t, addReq("u1")), fds: []func(testing.TB) int{ownFD}, flags: unix.MSG_TRUNC, wantErr: "truncated message"},
		{name: "control truncated", data: marshal(t, addReq("u1")), fds: []func(testing.TB) int{ownFD}, flags: unix.MSG_CTRUNC, wantErr: "truncated control"},
		{name: "garbage", data: []byte{0x0a, 0xff}, wantErr: "decode"},
		{name: "no payload", data: nil, wantErr: "without payload"},
		{name: "unknown field only", data: []byte{0x30, 0x01}, wantErr: "without payload"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var fds []int
			for _, open := range tc.fds {
				fds = append(fds, open(t))
			}
			req, err := decodeRequest(tc.data, fds, tc.flags)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				for _, fd := range fds {
					if isOpen(fd) {
						t.Errorf("fd %d left open after a refused request", fd)
						unix.Close(fd)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if req.kind != tc.kind || req.uid != tc.uid {
				t.Fatalf("got %v %q, want %v %q", req.kind, req.uid, tc.kind, tc.uid)
			}
			if (req.info == nil) != (tc.info == nil) || (req.info != nil && *req.info != *tc.info) {
				t.Fatalf("info %+v, want %+v", req.info, tc.info)
			}
			if (req.netns != nil) != (tc.kind == kindAdd) {
				t.Fatalf("netns %v for %v", req.netns, req.kind)
			}
			if req.netns != nil {
				req.netns.Close()
			}
		})
	}
}

// FuzzDecodeRequest feeds arbitrary packets, with 0-2 descriptors and any
// truncation flags, to the decoder: it must never panic, must close every
// descriptor it does not hand over, and must hand over a netns for exactly
// the Adds it accepts.
func FuzzDecodeRequest(f *testing.F) {
	for _, m := range []proto.Message{addReq("uid-1"), keepReq("uid-2"), delReq("uid-3"), snapReq(),
		&zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{Uid: "x"}}}} {
		b, _ := proto.Marshal(m)
		fuzzseed.Add(f, b, uint8(1), uint8(0))
		fuzzseed.Add(f, b, uint8(0), uint8(0))
		fuzzseed.Add(f, b[:len(b)/2], uint8(1), uint8(0))
	}
	fuzzseed.Add(f, []byte{0xff}, uint8(2), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, nfds, flagBits uint8) {
		var fds []int
		for range nfds % 3 {
			fds = append(fds, ownFD(t))
		}
		flags := 0
		if flagBits&1 != 0 {
			flags |= unix.MSG_TRUNC
		}
		if flagBits&2 != 0 {
			flags |= unix.MSG_CTRUNC
		}
		req, err := decodeRequest(data, append([]int(nil), fds...), flags)
		if err != nil {
			for _, fd := range fds {
				if isOpen(fd) {
					unix.Close(fd)
					t.Fatalf("fd left open after error %v", err)
				}
			}
			return
		}
		switch req.kind {
		case kindAdd:
			if req.netns == nil || len(fds) != 1 {
				t.Fatalf("add accepted with %d fds, netns %v", len(fds), req.netns)
			}
			req.netns.Close()
		case kindKeep, kindDel, kindSnapshot:
			if req.netns != nil || len(fds) != 0 {
				t.Fatalf("%v accepted with %d fds", req.kind, len(fds))
			}
		default:
			t.Fatalf("accepted unknown kind %v", req.kind)
		}
		if flags != 0 {
			t.Fatalf("accepted a truncated packet (flags %#x)", flags)
		}
	})
}
