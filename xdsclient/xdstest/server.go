package xdstest

import (
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// waitLimit bounds how long NextRequest waits before failing the test; it
// guards against hangs and is not a timing assertion.
const waitLimit = 10 * time.Second

// Options configures a Server. The zero value is a TLS server on a loopback
// port with a certificate for DefaultServerNames.
type Options struct {
	// TLS is the server's TLS material; nil creates one with NewTLS for
	// ServerNames.
	TLS *TLS
	// ServerNames are the names in the server certificate when TLS is nil.
	ServerNames []string
	// Listener, when set, is served instead of a new loopback listener (for
	// example one opened inside a lab network namespace). The server owns it.
	Listener net.Listener
}

// Request is one request the server received, with the headers of its
// stream.
type Request struct {
	*discoveryv3.DeltaDiscoveryRequest
	// Stream numbers the streams in the order they were opened, from 1.
	Stream int
	// Metadata holds the stream's request headers (authorization,
	// clusterid, extra headers, ...).
	Metadata metadata.MD
	// Received is when the server took the request off its stream, before
	// answering it: the scale benchmark times a push from a stream's first
	// request to the ACKs that end it.
	Received time.Time
}

// IsAck reports whether r answers a response without an error.
func (r *Request) IsAck() bool { return r.ResponseNonce != "" && r.ErrorDetail == nil }

// IsNack reports whether r answers a response with an error.
func (r *Request) IsNack() bool { return r.ResponseNonce != "" && r.ErrorDetail != nil }

// Server is a delta ADS server for tests: real gRPC over TLS on a loopback
// port, speaking the protocol with go-control-plane's types. It holds a set
// of resources per type URL and serves each stream the way istiod does:
// wildcard subscriptions get everything (minus what initial_resource_versions
// says the client already has, plus removals for what it has that no longer
// exists), named subscriptions get the named resources (a removal for names
// it does not have; a name that is an alias of a resource, as "network/IP"
// is of a workload in istiod's on-demand answers, gets that resource), and
// every change is pushed to the streams subscribed to it. It records every request for the test to inspect.
type Server struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer

	t    testing.TB
	tls  *TLS
	addr string

	serveWG sync.WaitGroup // the Serve goroutine
	// recvWG tracks each stream's receiving goroutine, which ends only
	// after its handler has returned (when gRPC closes the stream).
	recvWG sync.WaitGroup

	mu sync.Mutex // guards the following fields
	gs *grpc.Server
	// resources holds the current resources: type URL -> name -> resource.
	resources map[string]map[string]*discoveryv3.Resource
	streams   map[*serverStream]bool
	opened    int
	nonce     int
	requests  []*Request
	next      int           // index of the first request NextRequest has not returned
	arrived   chan struct{} // closed and replaced when a request is recorded
	stopped   bool
	// withheld holds the types Withhold silences, with the requests of
	// each that arrived meanwhile, answered in order by Release.
	withheld map[string][]heldRequest
}

// heldRequest is a request for a withheld type, answered on Release.
type heldRequest struct {
	ss *serverStream
	r  *discoveryv3.DeltaDiscoveryRequest
}

// serverStream is one client stream.
type serverStream struct {
	id     int
	st     grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]
	md     metadata.MD
	finish chan struct{} // closed by CloseStreams: end the stream cleanly

	// The following fields are guarded by Server.mu.
	subs map[string]*subscription
	// sent is what the client holds: type URL -> name -> version.
	sent map[string]map[string]string
}

type subscription struct {
	wildcard bool
	names    map[string]bool
}

// wants reports whether the subscription asks for r, by its name or, as
// istiod answers on-demand lookups of "network/IP", by one of its aliases.
func (sub *subscription) wants(r *discoveryv3.Resource) bool {
	if sub.wildcard || sub.names[r.Name] {
		return true
	}
	for _, a := range r.Aliases {
		if sub.names[a] {
			return true
		}
	}
	return false
}

// byAlias returns the resource of m that carries alias, or nil.
func byAlias(m map[string]*discoveryv3.Resource, alias string) *discoveryv3.Resource {
	for _, n := range sortedNames(m) {
		if slices.Contains(m[n].Aliases, alias) {
			return m[n]
		}
	}
	return nil
}

// NewServer starts a server and stops it when the test ends.
func NewServer(t testing.TB, opts Options) *Server {
	t.Helper()
	tlsm := opts.TLS
	if tlsm == nil {
		tlsm = NewTLS(t, opts.ServerNames...)
	}
	lis := opts.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	s := &Server{
		t:         t,
		tls:       tlsm,
		addr:      lis.Addr().String(),
		resources: map[string]map[string]*discoveryv3.Resource{},
		streams:   map[*serverStream]bool{},
		arrived:   make(chan struct{}),
		withheld:  map[string][]heldRequest{},
	}
	s.serve(lis)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) serve(lis net.Listener) {
	gs := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(s.tls.ServerConfig)),
		grpc.WaitForHandlers(true),
		// istiod lets clients ping every 15s; ztunnel pings every 30s.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 15 * time.Second, PermitWithoutStream: true}),
	)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, s)
	s.mu.Lock()
	s.gs = gs
	s.mu.Unlock()
	s.serveWG.Go(func() { _ = gs.Serve(lis) })
}

// Address returns the server's URL, "https://127.0.0.1:<port>".
func (s *Server) Address() string { return "https://" + s.addr }

// TLS returns the server's TLS material (RootFile for the client's RootCA).
func (s *Server) TLS() *TLS { return s.tls }

// Stop stops the server, breaking every stream. It is idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	gs, already := s.gs, s.stopped
	s.stopped = true
	s.mu.Unlock()
	if !already {
		gs.Stop()
		s.serveWG.Wait()
		s.recvWG.Wait()
	}
}

// Restart stops the server, breaking every stream as a crashed istiod would,
// and serves again on the same address with the same resources. It listens
// anew in the test process's network namespace, so it is for servers made
// without Options.Listener.
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	gs := s.gs
	s.mu.Unlock()
	gs.Stop()
	s.serveWG.Wait()
	lis, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.t.Fatalf("xdstest: listening again on %s: %v", s.addr, err)
	}
	s.serve(lis)
}

// Down stops serving, breaking every stream and refusing new connections,
// as an istiod outage does; Up serves again. The resources are kept, and
// Set and Update still change them meanwhile (a client sees the result
// when it reconnects).
func (s *Server) Down() {
	s.mu.Lock()
	gs := s.gs
	s.mu.Unlock()
	gs.Stop()
	s.serveWG.Wait()
}

// Up serves again after Down on lis, which must be a listener on the old
// address (opened in whatever network namespace the first one was). The
// server owns it.
func (s *Server) Up(lis net.Listener) {
	s.t.Helper()
	if lis.Addr().String() != s.addr {
		s.t.Fatalf("xdstest: Up on %s, but clients know %s", lis.Addr(), s.addr)
	}
	s.serve(lis)
}

// CloseStreams ends every open stream cleanly (an OK status), as istiod does
// when a connection reaches its maximum age.
func (s *Server) CloseStreams() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ss := range s.streams {
		select {
		case <-ss.finish:
		default:
			close(ss.finish)
		}
	}
}

// Withhold makes the server leave every request for typeURL unanswered
// (recorded, but neither subscribed nor answered) until Release, as a
// control plane that is slow to compute one type does: a client that
// waits for every type before serving stays unsynced meanwhile.
func (s *Server) Withhold(typeURL string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.withheld[typeURL]; !ok {
		s.withheld[typeURL] = nil
	}
}

// Release ends Withhold for typeURL: the requests held meanwhile are
// handled in order, on the streams still open, as if they had just arrived.
func (s *Server) Release(typeURL string) {
	s.mu.Lock()
	held, ok := s.withheld[typeURL]
	delete(s.withheld, typeURL)
	s.mu.Unlock()
	if !ok {
		return
	}
	for _, h := range held {
		s.mu.Lock()
		open := s.streams[h.ss]
		s.mu.Unlock()
		if open {
			s.answer(h.ss, h.r)
		}
	}
}

// StreamsOpened returns how many streams have been opened so far.
func (s *Server) StreamsOpened() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opened
}

// NewResource wraps msg as a resource with a name and version.
func NewResource(t testing.TB, name, version string, msg proto.Message) *discoveryv3.Resource {
	t.Helper()
	a, err := anypb.New(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &discoveryv3.Resource{Name: name, Version: version, Resource: a}
}

// Set adds or replaces one resource and pushes it.
func (s *Server) Set(typeURL, name, version string, msg proto.Message) {
	s.t.Helper()
	s.Update(typeURL, []*discoveryv3.Resource{NewResource(s.t, name, version, msg)}, nil)
}

// Remove deletes resources and pushes the removals.
func (s *Server) Remove(typeURL string, names ...string) { s.Update(typeURL, nil, names) }

// Update changes the resources of typeURL and pushes the change, as one
// response per stream, to every stream subscribed to any of them. A
// resource whose version equals what a stream already holds is not re-sent.
func (s *Server) Update(typeURL string, upserts []*discoveryv3.Resource, removes []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.resources[typeURL]
	if m == nil {
		m = map[string]*discoveryv3.Resource{}
		s.resources[typeURL] = m
	}
	for _, r := range upserts {
		m[r.Name] = r
	}
	for _, n := range removes {
		delete(m, n)
	}
	for ss := range s.streams {
		sub := ss.subs[typeURL]
		if sub == nil {
			continue
		}
		var send []*discoveryv3.Resource
		for _, r := range upserts {
			if sub.wants(r) && ss.sentVersion(typeURL, r.Name) != r.Version {
				send = append(send, r)
			}
		}
		var removed []string
		for _, n := range removes {
			if _, held := ss.sent[typeURL][n]; held {
				removed = append(removed, n)
			}
		}
		if len(send) > 0 || len(removed) > 0 {
			s.sendLocked(ss, typeURL, send, removed)
		}
	}
}

// Resources returns the current resources of typeURL, sorted by name.
func (s *Server) Resources(typeURL string) []*discoveryv3.Resource {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*discoveryv3.Resource
	for _, r := range s.resources[typeURL] {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *discoveryv3.Resource) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// NextRequest returns the oldest request not yet returned, waiting for one
// if needed; it fails the test if none arrives within a generous limit.
func (s *Server) NextRequest() *Request {
	s.t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		if s.next < len(s.requests) {
			r := s.requests[s.next]
			s.next++
			s.mu.Unlock()
			return r
		}
		ch := s.arrived
		s.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			s.t.Fatalf("xdstest: no request within %v", waitLimit)
		}
	}
}

// WaitRequest returns the next request for which match reports true,
// skipping (and returning nothing of) the ones before it.
func (s *Server) WaitRequest(match func(*Request) bool) *Request {
	s.t.Helper()
	for {
		if r := s.NextRequest(); match(r) {
			return r
		}
	}
}

// AllRequests returns every request received so far.
func (s *Server) AllRequests() []*Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// DeltaAggregatedResources serves one stream.
func (s *Server) DeltaAggregatedResources(st grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	md, _ := metadata.FromIncomingContext(st.Context())
	s.mu.Lock()
	s.opened++
	ss := &serverStream{
		id: s.opened, st: st, md: md, finish: make(chan struct{}),
		subs: map[string]*subscription{}, sent: map[string]map[string]string{},
	}
	s.streams[ss] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.streams, ss)
		s.mu.Unlock()
	}()

	reqs := make(chan *discoveryv3.DeltaDiscoveryRequest)
	recvErr := make(chan error, 1)
	s.recvWG.Go(func() {
		for {
			r, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- r:
			case <-st.Context().Done():
				return
			}
		}
	})
	for {
		select {
		case <-ss.finish:
			return nil
		case <-st.Context().Done():
			return st.Context().Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case r := <-reqs:
			s.handleRequest(ss, r)
		}
	}
}

func (s *Server) handleRequest(ss *serverStream, r *discoveryv3.DeltaDiscoveryRequest) {
	s.mu.Lock()
	s.requests = append(s.requests, &Request{DeltaDiscoveryRequest: r, Stream: ss.id, Metadata: ss.md, Received: time.Now()})
	close(s.arrived)
	s.arrived = make(chan struct{})
	if held, ok := s.withheld[r.TypeUrl]; ok {
		s.withheld[r.TypeUrl] = append(held, heldRequest{ss, r})
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.answer(ss, r)
}

// answer applies a recorded request to the stream's subscriptions and sends
// what it asks for.
func (s *Server) answer(ss *serverStream, r *discoveryv3.DeltaDiscoveryRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := r.TypeUrl
	sub := ss.subs[t]
	first := sub == nil
	if first {
		sub = &subscription{names: map[string]bool{}}
		ss.subs[t] = sub
		sub.wildcard = len(r.ResourceNamesSubscribe) == 0 ||
			slices.Contains(r.ResourceNamesSubscribe, "*") && !slices.Contains(r.ResourceNamesUnsubscribe, "*")
		held := make(map[string]string, len(r.InitialResourceVersions))
		for n, v := range r.InitialResourceVersions {
			held[n] = v
			if !sub.wildcard {
				sub.names[n] = true
			}
		}
		ss.sent[t] = held
	}
	var added []string
	for _, n := range r.ResourceNamesSubscribe {
		if n != "*" && !sub.names[n] {
			sub.names[n] = true
			added = append(added, n)
		}
	}
	for _, n := range r.ResourceNamesUnsubscribe {
		delete(sub.names, n)
	}

	var send []*discoveryv3.Resource
	var removed []string
	current := s.resources[t]
	consider := func(n string) {
		res, ok := current[n]
		if !ok && !sub.wildcard {
			// A name istiod resolves: the resource it is an alias of
			// (sent under its own name, with its aliases).
			if res = byAlias(current, n); res != nil {
				ok, n = true, res.Name
			}
		}
		switch {
		case ok && ss.sentVersion(t, n) != res.Version:
			send = append(send, res)
		case !ok:
			// Tell the client it does not exist (or no longer does).
			removed = append(removed, n)
		}
	}
	switch {
	case first && sub.wildcard:
		for _, n := range sortedNames(current) {
			consider(n)
		}
		for _, n := range sortedNames(ss.sent[t]) {
			if _, ok := current[n]; !ok {
				removed = append(removed, n)
			}
		}
	case first:
		for _, n := range sortedNames(sub.names) {
			consider(n)
		}
	default:
		for _, n := range added {
			consider(n)
		}
	}
	// A wildcard subscription always gets an answer, possibly empty, so the
	// client learns it is up to date (istiod does the same).
	if len(send) > 0 || len(removed) > 0 || (first && sub.wildcard) {
		s.sendLocked(ss, t, send, removed)
	}
}

func (ss *serverStream) sentVersion(typeURL, name string) string {
	v, ok := ss.sent[typeURL][name]
	if !ok {
		return "\x00absent" // differs from every real version, including ""
	}
	return v
}

// sendLocked sends one response and records what the client now holds.
func (s *Server) sendLocked(ss *serverStream, typeURL string, res []*discoveryv3.Resource, removed []string) {
	s.nonce++
	held := ss.sent[typeURL]
	for _, r := range res {
		held[r.Name] = r.Version
	}
	for _, n := range removed {
		delete(held, n)
	}
	// A failed send means the stream is ending; the handler sees that from
	// Recv.
	_ = ss.st.Send(&discoveryv3.DeltaDiscoveryResponse{
		TypeUrl:           typeURL,
		Nonce:             strconv.Itoa(s.nonce),
		SystemVersionInfo: strconv.Itoa(s.nonce),
		Resources:         res,
		RemovedResources:  removed,
	})
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
