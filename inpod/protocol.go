package inpod

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/api/zdsapi"
)

// maxPacket is the receive buffer for one request, as ztunnel's: a longer
// packet arrives truncated (MSG_TRUNC) and is refused.
const maxPacket = 1024

// oobSpace holds the control message of one descriptor: a request carries at
// most one (Add's netns); more arrive truncated (MSG_CTRUNC) and are refused.
var oobSpace = unix.CmsgSpace(4)

// WorkloadInfo names the pod behind an Add (ZDS WorkloadInfo).
type WorkloadInfo struct {
	Name, Namespace, ServiceAccount string
}

type requestKind uint8

const (
	kindAdd requestKind = iota + 1
	kindKeep
	kindDel
	kindSnapshot
)

func (k requestKind) String() string {
	switch k {
	case kindAdd:
		return "add"
	case kindKeep:
		return "keep"
	case kindDel:
		return "del"
	case kindSnapshot:
		return "snapshot_sent"
	}
	return "unknown"
}

// request is one decoded WorkloadRequest.
type request struct {
	kind  requestKind
	uid   string
	info  *WorkloadInfo // Add only; nil when the agent sent none
	netns *Netns        // Add only; owned by whoever holds the request
}

// readRequest reads one packet and decodes it. The descriptors that came
// with it are either handed over in request.netns or closed, whatever fails.
// A clean end of stream is io.EOF.
func readRequest(c *net.UnixConn, buf, oob []byte) (request, error) {
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	fds, ferr := parseRights(oob[:oobn])
	if err != nil {
		closeFDs(fds)
		return request{}, err
	}
	if ferr != nil {
		closeFDs(fds)
		return request{}, ferr
	}
	if n == 0 && oobn == 0 {
		// A zero-length SEQPACKET read is the peer's close.
		return request{}, io.EOF
	}
	return decodeRequest(buf[:n], fds, flags)
}

// parseRights collects the descriptors of every SCM_RIGHTS message in oob.
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("inpod: control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue // credentials and the like: nothing to release
		}
		if len(m.Data)%4 != 0 {
			// x/sys/unix.ParseUnixRights indexes past its slice on such a
			// payload (found by FuzzParseRights). The kernel never sends
			// one; refuse it rather than trust that.
			return fds, fmt.Errorf("inpod: SCM_RIGHTS payload of %d bytes", len(m.Data))
		}
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, fmt.Errorf("inpod: SCM_RIGHTS: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// decodeRequest decodes a packet's bytes with the descriptors that came
// with it (ownership passes here) and the recvmsg flags. Only Add may carry
// a descriptor, exactly one, and it must be a network namespace.
func decodeRequest(data []byte, fds []int, flags int) (req request, err error) {
	defer func() {
		if err != nil {
			closeFDs(fds)
		}
	}()
	if flags&unix.MSG_TRUNC != 0 {
		return request{}, errors.New("inpod: received truncated message")
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return request{}, errors.New("inpod: received truncated control message")
	}
	if len(fds) > 1 {
		return request{}, fmt.Errorf("inpod: expected 1 descriptor, got %d", len(fds))
	}
	var m zdsapi.WorkloadRequest
	if err := proto.Unmarshal(data, &m); err != nil {
		return request{}, fmt.Errorf("inpod: decode WorkloadRequest: %w", err)
	}
	switch p := m.Payload.(type) {
	case *zdsapi.WorkloadRequest_Add:
		if len(fds) == 0 {
			return request{}, errors.New("inpod: add without a netns descriptor")
		}
		req = request{kind: kindAdd, uid: p.Add.GetUid()}
		if wi := p.Add.GetWorkloadInfo(); wi != nil {
			req.info = &WorkloadInfo{Name: wi.GetName(), Namespace: wi.GetNamespace(), ServiceAccount: wi.GetServiceAccount()}
		}
		ns, err := NewNetns(os.NewFile(uintptr(fds[0]), "netns"))
		fds = nil // NewNetns owns (and on error has closed) it
		if err != nil {
			return request{}, err
		}
		req.netns = ns
		return req, nil
	case nil:
		return request{}, errors.New("inpod: request without payload")
	}
	if len(fds) > 0 {
		return request{}, errors.New("inpod: unexpected descriptor on a request other than add")
	}
	switch p := m.Payload.(type) {
	case *zdsapi.WorkloadRequest_Keep:
		return request{kind: kindKeep, uid: p.Keep.GetUid()}, nil
	case *zdsapi.WorkloadRequest_Del:
		return request{kind: kindDel, uid: p.Del.GetUid()}, nil
	case *zdsapi.WorkloadRequest_SnapshotSent:
		return request{kind: kindSnapshot}, nil
	}
	return request{}, fmt.Errorf("inpod: unknown request payload %T", m.Payload)
}

// helloPacket is ZdsHello{version: V1}.
func helloPacket() []byte {
	b, _ := proto.Marshal(&zdsapi.ZdsHello{Version: zdsapi.Version_V1})
	return b
}

// ackPacket is the one WorkloadResponse to a request: an empty error is an
// Ack, anything else a Nack.
func ackPacket(errText string) []byte {
	b, _ := proto.Marshal(&zdsapi.WorkloadResponse{Payload: &zdsapi.WorkloadResponse_Ack{Ack: &zdsapi.Ack{Error: errText}}})
	return b
}
