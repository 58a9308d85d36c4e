package labrun

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sync"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// WaypointRequest is one CONNECT a Waypoint received.
type WaypointRequest struct {
	// Authority is the request's :authority (the original VIP:port for
	// service traffic).
	Authority string
	// Peer is the client's certificate identity.
	Peer identity.Identity
	// From is the TCP peer of the tunnel connection.
	From netip.AddrPort
}

// Waypoint stands in for an Istio waypoint proxy inside a pod: it terminates
// HBONE (mTLS with a given workload certificate, HTTP/2 CONNECT), records
// every request, answers 200, writes the line "waypoint <authority>\n" and
// then echoes the stream, half-closing when the client does. Tests see from
// the first line that the traffic went through it and with which authority.
type Waypoint struct {
	hl hboneListener
	// Addr is where the waypoint listens.
	Addr netip.AddrPort

	mu       sync.Mutex // guards requests
	requests []WaypointRequest
}

// StartWaypoint listens on port on all of pod's addresses and serves HBONE
// with cert, which must chain to the lab's CA for the daemons to accept it.
func StartWaypoint(pod *netnslab.Pod, port uint16, cert *mtls.WorkloadCert) (*Waypoint, error) {
	ln, err := pod.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		return nil, fmt.Errorf("labrun: waypoint in %s: %w", pod.Name, err)
	}
	w := &Waypoint{Addr: netip.AddrPortFrom(pod.IP, port)}
	w.hl.start(ln, cert, w.serveStream, nil)
	return w, nil
}

func (w *Waypoint) serveStream(_ context.Context, req *hbone.ServerRequest) {
	r := WaypointRequest{Authority: req.Authority}
	if ap, err := netip.ParseAddrPort(req.Conn.RemoteAddr().String()); err == nil {
		r.From = ap
	}
	if tc, ok := req.Conn.(*tls.Conn); ok {
		r.Peer, _ = mtls.PeerIdentity(tc.ConnectionState())
	}
	w.mu.Lock()
	w.requests = append(w.requests, r)
	w.mu.Unlock()
	s, err := req.Respond(http.StatusOK, nil)
	if err != nil {
		return
	}
	defer s.Close()
	if _, err := io.WriteString(s, "waypoint "+req.Authority+"\n"); err != nil {
		return
	}
	if _, err := io.Copy(s, s); err == nil {
		s.CloseWrite()
	}
}

// Requests returns every request received so far, in arrival order.
func (w *Waypoint) Requests() []WaypointRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]WaypointRequest(nil), w.requests...)
}

// Close stops the waypoint and ends its connections and streams.
func (w *Waypoint) Close() error { return w.hl.close() }
