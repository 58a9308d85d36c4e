package inpod

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

// FuzzParseRights feeds arbitrary control-message bytes, as recvmsg returns
// them from the ZDS socket, to parseRights. It must never panic, and every
// descriptor it reports takes four bytes of an SCM_RIGHTS payload. The
// descriptors are numbers from the input, so they are never closed here.
func FuzzParseRights(f *testing.F) {
	creds := unix.UnixCredentials(&unix.Ucred{Pid: 1, Uid: 0, Gid: 0})
	for _, oob := range [][]byte{
		unix.UnixRights(7),
		unix.UnixRights(7, 8),
		append(creds, unix.UnixRights(9)...),
		unix.UnixRights(7)[:unix.CmsgSpace(4)-3],
		{},
	} {
		fuzzseed.Add(f, oob)
	}
	f.Fuzz(func(t *testing.T, oob []byte) {
		fds, err := parseRights(oob)
		if err == nil && len(fds)*4 > len(oob) {
			t.Fatalf("%d descriptors from %d bytes", len(fds), len(oob))
		}
	})
}
