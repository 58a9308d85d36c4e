// Package zdstest is a fake Istio CNI agent for tests: it serves ZDS on a
// unix SOCK_SEQPACKET socket, replays its pods to every daemon that
// connects (Add with the pod's netns fd in SCM_RIGHTS, or Keep, then
// SnapshotSent), sends Add and Del as tests add and remove pods, and reads
// the one Ack or Nack each request gets. Like the real agent, it sends live
// updates to the most recent connection only, so an old daemon and a new one
// can overlap during an upgrade.
//
// A Manual server hands connections to the test instead (Accept), to script
// malformed or out-of-order exchanges.
//
// Imports (of ours): api/zdsapi. Imported by: internal/labrun and tests.
package zdstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/api/zdsapi"
)

// ErrNotConnected is returned by Add and Del when no daemon is connected: the
// change is kept and reaches the next daemon in its snapshot.
var ErrNotConnected = errors.New("zdstest: no daemon connected")

// Pod is a pod the fake agent knows.
type Pod struct {
	UID                             string
	Name, Namespace, ServiceAccount string
	// NetnsPath is the pod's network namespace file (/run/netns/NAME,
	// /proc/PID/ns/net); it is opened for each Add and closed once sent.
	NetnsPath string
	// Keep replays the pod as KeepWorkload (an agent that lost the pod's
	// netns after a restart) instead of AddWorkload.
	Keep bool
	// NoInfo sends Add without workload info (a protocol error).
	NoInfo bool
}

// Config configures a Server.
type Config struct {
	// Path is the socket to serve; an existing file there is removed.
	Path string
	// AckTimeout bounds the wait for each response; 0 means 10s.
	AckTimeout time.Duration
	// Manual hands every connection to Accept instead of serving it.
	Manual bool
	// Logf receives the exchanges; nil discards.
	Logf func(format string, args ...any)
}

// Event is one request sent and its response.
type Event struct {
	Conn    int    // connection number, from 1
	Request string // "add", "keep", "del", "snapshot_sent"
	UID     string
	Error   string // the Nack's error; "" for an Ack
}

// Server is a fake CNI agent.
type Server struct {
	cfg Config
	ln  *net.UnixListener
	wg  sync.WaitGroup // accept loop and connection handshakes

	accepted chan *Conn // Manual mode

	mu        sync.Mutex // guards the following fields; held across a request and its response
	pods      map[string]Pod
	order     []string // uids in first-Add order, for a stable replay
	conns     []*Conn
	active    *Conn // the most recent connection that took a snapshot
	nconns    int
	snapshots int
	events    []Event
	changed   chan struct{} // closed and replaced on every snapshot or event
	closed    bool
}

// Start listens on cfg.Path and serves in the background.
func Start(cfg Config) (*Server, error) {
	if cfg.Path == "" {
		return nil, errors.New("zdstest: Config.Path is required")
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 10 * time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	_ = os.Remove(cfg.Path)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: cfg.Path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("zdstest: listen: %w", err)
	}
	s := &Server{cfg: cfg, ln: ln, pods: map[string]Pod{}, changed: make(chan struct{}), accepted: make(chan *Conn, 16)}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Path is the socket path (INPOD_UDS for the daemon).
func (s *Server) Path() string { return s.cfg.Path }

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		uc, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			uc.Close()
			return
		}
		s.nconns++
		c := &Conn{c: uc, n: s.nconns, timeout: s.cfg.AckTimeout, srv: s}
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		if s.cfg.Manual {
			select {
			case s.accepted <- c:
			default:
				c.Close() // nobody is accepting: refuse rather than block
			}
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.handshake(c); err != nil {
				s.cfg.Logf("zdstest: connection %d: %v", c.n, err)
				c.Close()
			}
		}()
	}
}

// handshake reads the hello and replays every pod, then makes c the
// connection live updates go to.
func (s *Server) handshake(c *Conn) error {
	v, err := c.Hello()
	if err != nil {
		return err
	}
	if v != zdsapi.Version_V1 {
		return fmt.Errorf("hello with version %v, want V1", v)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("server closed")
	}
	for _, uid := range s.order {
		p := s.pods[uid]
		if p.Keep {
			if _, err := s.sendLocked(c, "keep", uid, &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Keep{Keep: &zdsapi.KeepWorkload{Uid: uid}}}, ""); err != nil {
				return err
			}
			continue
		}
		if _, err := s.sendAddLocked(c, p); err != nil {
			var oe *openError
			if !errors.As(err, &oe) {
				return err
			}
			// The pod's sandbox is gone: the real agent would not replay it.
			s.cfg.Logf("zdstest: connection %d: skipping %s in the snapshot: %v", c.n, uid, err)
		}
	}
	if _, err := s.sendLocked(c, "snapshot_sent", "", &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_SnapshotSent{SnapshotSent: &zdsapi.SnapshotSent{}}}, ""); err != nil {
		return err
	}
	s.active = c
	s.snapshots++
	s.notifyLocked()
	s.cfg.Logf("zdstest: connection %d synced (%d pods)", c.n, len(s.order))
	return nil
}

func addRequest(p Pod) *zdsapi.WorkloadRequest {
	add := &zdsapi.AddWorkload{Uid: p.UID}
	if !p.NoInfo {
		add.WorkloadInfo = &zdsapi.WorkloadInfo{Name: p.Name, Namespace: p.Namespace, ServiceAccount: p.ServiceAccount}
	}
	return &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Add{Add: add}}
}

func (s *Server) sendAddLocked(c *Conn, p Pod) (string, error) {
	return s.sendLocked(c, "add", p.UID, addRequest(p), p.NetnsPath)
}

// sendLocked sends one request (with the netns at nsPath, if any) and
// records its response.
func (s *Server) sendLocked(c *Conn, kind, uid string, req *zdsapi.WorkloadRequest, nsPath string) (string, error) {
	var fd *os.File
	if nsPath != "" {
		f, err := os.Open(nsPath)
		if err != nil {
			return "", &openError{uid, err}
		}
		defer f.Close()
		fd = f
	}
	ack, err := c.Send(req, fd)
	if err != nil {
		return "", err
	}
	s.events = append(s.events, Event{Conn: c.n, Request: kind, UID: uid, Error: ack})
	s.notifyLocked()
	s.cfg.Logf("zdstest: connection %d: %s %s -> %q", c.n, kind, uid, ack)
	return ack, nil
}

// openError is a pod whose netns could not be opened: nothing was sent.
type openError struct {
	uid string
	err error
}

func (e *openError) Error() string { return fmt.Sprintf("zdstest: open netns of %s: %v", e.uid, e.err) }
func (e *openError) Unwrap() error { return e.err }

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Add records the pod and, if a daemon is connected, sends it Add and
// returns the response's error ("" for an Ack). With no daemon connected it
// returns ErrNotConnected; the pod is in the next snapshot either way.
func (s *Server) Add(p Pod) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pods[p.UID]; !ok {
		s.order = append(s.order, p.UID)
	}
	s.pods[p.UID] = p
	if s.active == nil {
		return "", ErrNotConnected
	}
	ack, err := s.sendAddLocked(s.active, p)
	var oe *openError
	if err != nil && !errors.As(err, &oe) {
		s.dropActiveLocked()
	}
	return ack, err
}

// Del forgets the pod and, if a daemon is connected, sends it Del.
func (s *Server) Del(uid string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pods[uid]; ok {
		delete(s.pods, uid)
		for i, u := range s.order {
			if u == uid {
				s.order = append(s.order[:i], s.order[i+1:]...)
				break
			}
		}
	}
	if s.active == nil {
		return "", ErrNotConnected
	}
	ack, err := s.sendLocked(s.active, "del", uid, &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Del{Del: &zdsapi.DelWorkload{Uid: uid}}}, "")
	if err != nil {
		s.dropActiveLocked()
	}
	return ack, err
}

// Keep sends KeepWorkload for uid to the connected daemon. After the
// snapshot that is a protocol error, on which the daemon exits.
func (s *Server) Keep(uid string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active == nil {
		return "", ErrNotConnected
	}
	return s.sendLocked(s.active, "keep", uid, &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Keep{Keep: &zdsapi.KeepWorkload{Uid: uid}}}, "")
}

// SendRaw sends b as one packet to the connected daemon and returns the
// response's error text: malformed input for the daemon to refuse. The
// daemon then reconnects, so the connection stops being the active one.
func (s *Server) SendRaw(b []byte) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active == nil {
		return "", ErrNotConnected
	}
	c := s.active
	s.active = nil
	ack, err := c.SendRaw(b)
	if err == nil {
		s.events = append(s.events, Event{Conn: c.n, Request: "raw", Error: ack})
		s.notifyLocked()
	}
	return ack, err
}

func (s *Server) dropActiveLocked() {
	s.active.Close()
	s.active = nil
}

// Pods returns the pods the agent knows, by uid.
func (s *Server) Pods() []Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Pod, 0, len(s.order))
	for _, uid := range s.order {
		out = append(out, s.pods[uid])
	}
	return out
}

// Events returns every request sent so far and its response.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

// Nacks returns the events that were Nacked.
func (s *Server) Nacks() []Event {
	var out []Event
	for _, e := range s.Events() {
		if e.Error != "" {
			out = append(out, e)
		}
	}
	return out
}

// Connections returns how many connections the server has accepted.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nconns
}

// Snapshots returns how many snapshots have been acknowledged in total
// (one per daemon connection that synced; a connection cut before its
// snapshot counts none).
func (s *Server) Snapshots() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshots
}

// WaitSnapshots waits until n snapshots in total have been acknowledged
// (one per daemon connection that synced).
func (s *Server) WaitSnapshots(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		got, ch := s.snapshots, s.changed
		s.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("zdstest: %d of %d snapshots: %w", got, n, ctx.Err())
		}
	}
}

// Accept returns the next connection of a Manual server.
func (s *Server) Accept(ctx context.Context) (*Conn, error) {
	select {
	case c := <-s.accepted:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// CloseConns closes every connection (an agent restart, or a lost stream);
// the pods stay known and are replayed to the next connection.
func (s *Server) CloseConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns, s.active = nil, nil
}

// Close stops listening, closes every connection and waits for the
// server's goroutines.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	s.closed = true
	for _, c := range s.conns {
		c.Close()
	}
	s.conns, s.active = nil, nil
	s.mu.Unlock()
	s.wg.Wait()
	// Manual connections nobody accepted (the accept loop has ended).
	for len(s.accepted) > 0 {
		(<-s.accepted).Close()
	}
	_ = os.Remove(s.cfg.Path)
	return err
}

// Conn is one daemon connection, driven by hand in a Manual server.
type Conn struct {
	c       *net.UnixConn
	n       int
	timeout time.Duration
	srv     *Server
}

// Hello reads the daemon's ZdsHello.
func (c *Conn) Hello() (zdsapi.Version, error) {
	b, err := c.read()
	if err != nil {
		return 0, fmt.Errorf("zdstest: read hello: %w", err)
	}
	var h zdsapi.ZdsHello
	if err := proto.Unmarshal(b, &h); err != nil {
		return 0, fmt.Errorf("zdstest: decode hello: %w", err)
	}
	return h.GetVersion(), nil
}

// Send sends a request, with netns (if not nil) in SCM_RIGHTS, and returns
// the response's error text ("" for an Ack).
func (c *Conn) Send(req *zdsapi.WorkloadRequest, netns *os.File) (string, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return "", err
	}
	var fds []int
	if netns != nil {
		fds = []int{int(netns.Fd())}
	}
	return c.SendRaw(b, fds...)
}

// SendRaw sends b as one packet with fds in SCM_RIGHTS and returns the
// response's error text.
func (c *Conn) SendRaw(b []byte, fds ...int) (string, error) {
	if err := c.SendNoReply(b, fds...); err != nil {
		return "", err
	}
	return c.ReadAck()
}

// SendNoReply sends b as one packet with fds in SCM_RIGHTS and reads
// nothing back (a zero-length packet, which the daemon takes for the end of
// the stream, gets no response).
func (c *Conn) SendNoReply(b []byte, fds ...int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	c.c.SetWriteDeadline(time.Now().Add(c.timeout))
	if _, _, err := c.c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("zdstest: send: %w", err)
	}
	return nil
}

// ReadAck reads one WorkloadResponse and returns its error text.
func (c *Conn) ReadAck() (string, error) {
	b, err := c.read()
	if err != nil {
		return "", fmt.Errorf("zdstest: read response: %w", err)
	}
	var r zdsapi.WorkloadResponse
	if err := proto.Unmarshal(b, &r); err != nil {
		return "", fmt.Errorf("zdstest: decode response: %w", err)
	}
	ack := r.GetAck()
	if ack == nil {
		return "", errors.New("zdstest: response without ack")
	}
	return ack.GetError(), nil
}

func (c *Conn) read() ([]byte, error) {
	buf := make([]byte, 4096)
	c.c.SetReadDeadline(time.Now().Add(c.timeout))
	n, err := c.c.Read(buf)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errors.New("connection closed")
	}
	return buf[:n], nil
}

// WaitClosed waits until the daemon closes the connection (or ctx ends),
// discarding anything it sends.
func (c *Conn) WaitClosed(ctx context.Context) error {
	buf := make([]byte, 4096)
	for {
		dl, ok := ctx.Deadline()
		if !ok {
			dl = time.Now().Add(time.Minute)
		}
		c.c.SetReadDeadline(dl)
		n, err := c.c.Read(buf)
		if err != nil || n == 0 {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return nil
		}
	}
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }
