package xdsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ztunnel-go/ztunnel/controlplane"
)

var (
	// ErrNotOnDemand is returned by Lookup for a type URL that is not
	// subscribed on demand.
	ErrNotOnDemand = errors.New("xdsclient: type is not subscribed on demand")
	// ErrStopped is returned by Lookup once Run has returned.
	ErrStopped = errors.New("xdsclient: client stopped")
)

// Reconnection timing, as in ztunnel: connection failures and unexpected gRPC
// errors back off from 10ms doubling to 15s; streams that end cleanly
// reconnect at once.
const (
	initialBackoff = 10 * time.Millisecond
	maxBackoff     = 15 * time.Second
)

// maxRecvMsgSize bounds one response, as ztunnel does (200 MiB).
const maxRecvMsgSize = 200 << 20

// demandQueue is how many on-demand lookups may wait for the stream.
const demandQueue = 100

// Config configures a Client. Address is required; other zero values are
// documented per field.
type Config struct {
	// Address is istiod's xDS URL (XDS_ADDRESS), e.g.
	// "https://istiod.istio-system.svc:15012"; https:// is assumed when the
	// scheme is missing.
	Address string
	// RootCA verifies istiod (XDS_ROOT_CA): a PEM file path (re-read when
	// it changes), "SYSTEM", or inline PEM. Empty means the system roots.
	RootCA string
	// AltHostname is accepted as istiod's name when the address's host does
	// not match its certificate (ALT_XDS_HOSTNAME). Empty: none.
	AltHostname string
	// TokenPath is the JWT file sent as "authorization: Bearer", re-read for
	// every stream (AUTH_TOKEN when it names a file). Token is a static JWT
	// used when TokenPath is empty. With neither, no auth headers are sent.
	TokenPath, Token string
	// ClusterID goes in the clusterid header next to the token.
	ClusterID string
	// Headers are extra gRPC metadata for the stream (XDS_HEADER_*).
	Headers map[string]string
	// Node is sent in the first request of each type. Build it with NewNode.
	// Nil sends an empty node.
	Node *corev3.Node
	// OnDemandTypes lists the registered type URLs that are subscribed on
	// demand (XDS_ON_DEMAND: the Address type): their initial request asks
	// for nothing, Lookup asks for single names, and Synced does not wait
	// for them. Empty: every type is a wildcard subscription.
	OnDemandTypes []string
	// Logf receives connection events at ztunnel's levels: connection
	// failures and unexpected stream ends at warn, NACKs at error, stream
	// establishment and on-demand requests at info, routine reconnects at
	// debug. Nil discards them.
	Logf func(level slog.Level, format string, args ...any)
	// DialOptions are added to the gRPC connection's options.
	DialOptions []grpc.DialOption
	// CurvePreferences restricts the TLS key exchange with istiod
	// (COMPLIANCE_POLICY=pqc); nil is Go's default.
	CurvePreferences []tls.CurveID
	// OnMessage, when set, is called for every response received, with its
	// type URL and the size of its resources' values (ztunnel's
	// istio_xds_message_total and istio_xds_message_bytes_total). It runs
	// on the client's goroutine and must not block.
	OnMessage func(typeURL string, resourceBytes int)
	// OnTermination, when set, is called each time a stream to the server
	// ends other than by Run's context, with ztunnel's reason
	// (istio_xds_connection_terminations_total): one of the Termination*
	// constants. It runs on the client's goroutine and must not block.
	OnTermination func(reason string)
}

// Why a stream ended, as ztunnel's xDS client names it.
const (
	// TerminationConnectionError: the connection or stream could not be
	// established.
	TerminationConnectionError = "ConnectionError"
	// TerminationReconnect: the server went away (a gRPC status meaning
	// "reconnect": Unknown, Canceled, DeadlineExceeded, Unavailable while
	// the transport closes or after a GOAWAY).
	TerminationReconnect = "Reconnect"
	// TerminationError: any other failure of the stream.
	TerminationError = "Error"
	// TerminationComplete: the server ended the stream cleanly.
	TerminationComplete = "Complete"
)

// terminationReason classifies how a stream ended (err from runStream) the
// way ztunnel's run_loop does, matching retryDelay's cases.
func terminationReason(err error) string {
	if err == nil {
		return TerminationComplete
	}
	if ce := (*connError)(nil); errors.As(err, &ce) {
		return TerminationConnectionError
	}
	st, ok := status.FromError(err)
	if !ok {
		return TerminationError
	}
	switch {
	case st.Code() == codes.Unknown, st.Code() == codes.Canceled, st.Code() == codes.DeadlineExceeded,
		st.Code() == codes.Unavailable && (strings.Contains(st.Message(), "transport is closing") ||
			strings.Contains(st.Message(), "received prior goaway")):
		return TerminationReconnect
	}
	return TerminationError
}

// Resource is one resource of a response: its name, the version the server
// gave it, and its raw value.
type Resource struct {
	Name    string
	Version string
	// Value is the resource. Never nil: the client rejects resources that
	// arrive without one before calling the handler.
	Value *anypb.Any
}

// Update is one response's changes to one type: resources added or changed,
// and names removed.
type Update struct {
	TypeURL   string
	Resources []Resource
	Removed   []string
}

// Rejection says why one resource of an update was not applied.
type Rejection struct {
	Name string
	Err  error
}

// Error returns "<name>: <reason>", the form that goes into a NACK.
func (r Rejection) Error() string { return r.Name + ": " + r.Err.Error() }

// Unwrap returns the reason.
func (r Rejection) Unwrap() error { return r.Err }

// Handler applies updates of one type URL. Handle is called from the client's
// goroutine, one update at a time, in stream order. It applies every valid
// resource and removal and returns one Rejection per resource it refused
// (nil when all were applied); the client then ACKs, or NACKs naming the
// rejected ones. A rejected resource keeps whatever the handler held before.
//
// Handle must return only once the update is visible to readers: on-demand
// lookups are woken right after it returns.
type Handler interface {
	Handle(u *Update) []Rejection
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(u *Update) []Rejection

// Handle calls f(u).
func (f HandlerFunc) Handle(u *Update) []Rejection { return f(u) }

// Client is a delta ADS client. Create it with New, Register a Handler per
// type URL, then call Run.
type Client struct {
	cfg      Config
	logf     func(slog.Level, string, ...any)
	node     *corev3.Node
	onDemand map[string]bool

	handlers map[string]Handler
	types    []string // registration order, the order of initial requests

	started atomic.Bool
	demands chan demand
	synced  chan struct{}
	stopped chan struct{}

	// The following fields are owned by the Run goroutine.
	// known holds, per type, the version of every resource accepted (or
	// demanded and not yet received, with version ""), for
	// initial_resource_versions on reconnect.
	known map[string]*versions
	// pending holds the on-demand lookups waiting for a response that
	// mentions their resource.
	pending map[resourceKey][]chan struct{}
	// expect holds the types whose first ACK Synced still waits for.
	expect map[string]bool
}

type resourceKey struct{ typeURL, name string }

type demand struct {
	key  resourceKey
	done chan struct{}
}

// New returns a client for cfg.
func New(cfg Config) *Client {
	c := &Client{
		cfg:      cfg,
		logf:     cfg.Logf,
		node:     cfg.Node,
		onDemand: map[string]bool{},
		handlers: map[string]Handler{},
		demands:  make(chan demand, demandQueue),
		synced:   make(chan struct{}),
		stopped:  make(chan struct{}),
		known:    map[string]*versions{},
		pending:  map[resourceKey][]chan struct{}{},
		expect:   map[string]bool{},
	}
	if c.logf == nil {
		c.logf = func(slog.Level, string, ...any) {}
	}
	if c.node == nil {
		c.node = &corev3.Node{}
	}
	for _, t := range cfg.OnDemandTypes {
		c.onDemand[t] = true
	}
	return c
}

// Register sets the handler for typeURL and subscribes to it. It must be
// called before Run; it panics afterwards or for a type registered twice.
func (c *Client) Register(typeURL string, h Handler) {
	if c.started.Load() {
		panic("xdsclient: Register after Run")
	}
	if _, dup := c.handlers[typeURL]; dup {
		panic("xdsclient: type " + typeURL + " registered twice")
	}
	c.handlers[typeURL] = h
	c.types = append(c.types, typeURL)
}

// Synced returns a channel closed once the first response of every
// registered type that is not on demand has been applied and ACKed (a NACKed
// first response does not count). It stays closed across reconnections.
func (c *Client) Synced() <-chan struct{} { return c.synced }

// Lookup asks the server for one resource of an on-demand type and waits
// until a response mentions it (as an update or a removal) and its handler
// has run, or ctx ends. The caller then reads the result from wherever the
// handler put it. While the client is disconnected the request waits for the
// next stream.
func (c *Client) Lookup(ctx context.Context, typeURL, name string) error {
	if !c.onDemand[typeURL] || c.handlers[typeURL] == nil {
		return fmt.Errorf("%w: %s", ErrNotOnDemand, typeURL)
	}
	d := demand{key: resourceKey{typeURL, name}, done: make(chan struct{})}
	select {
	case c.demands <- d:
	case <-c.stopped:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-d.done:
		return nil
	case <-c.stopped:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run connects to the server and keeps the subscription alive until ctx is
// done, reconnecting with backoff. It returns ctx's error, or an error at
// once if the configuration is unusable or Run was already called.
func (c *Client) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("xdsclient: Run called twice")
	}
	defer close(c.stopped)
	if len(c.types) == 0 {
		return errors.New("xdsclient: no handler registered")
	}
	for _, t := range c.types {
		if !c.onDemand[t] {
			c.expect[t] = true
		}
	}
	for t := range c.onDemand {
		if c.handlers[t] == nil {
			return fmt.Errorf("xdsclient: on-demand type %s has no handler", t)
		}
	}
	if len(c.expect) == 0 {
		close(c.synced)
	}
	cpCfg := controlplane.Config{
		Address: c.cfg.Address, RootCA: c.cfg.RootCA, AltHostname: c.cfg.AltHostname,
		TokenPath: c.cfg.TokenPath, Token: c.cfg.Token, ClusterID: c.cfg.ClusterID, Headers: c.cfg.Headers,
		CurvePreferences: c.cfg.CurvePreferences,
	}
	// Check the address (and inline roots) once, so that a configuration
	// that cannot get better fails Run instead of retrying forever. A root
	// file that is missing or bad is retried with backoff: Kubernetes may
	// mount it after the daemon starts.
	cc, err := c.dial(cpCfg)
	if err != nil {
		return err
	}
	_ = cc.Close()

	backoff := initialBackoff
	for attempt := 1; ; attempt++ {
		err := c.runStream(ctx, cpCfg, attempt)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if c.cfg.OnTermination != nil {
			c.cfg.OnTermination(terminationReason(err))
		}
		var delay time.Duration
		delay, backoff = retryDelay(err, backoff)
		c.logEnd(attempt, err, delay)
		if delay == 0 {
			continue
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (c *Client) dial(cfg controlplane.Config) (*grpc.ClientConn, error) {
	opts := append([]grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)),
	}, c.cfg.DialOptions...)
	cc, err := controlplane.Dial(cfg, opts...)
	if err != nil {
		return nil, fmt.Errorf("xdsclient: %w", err)
	}
	return cc, nil
}

// logEnd logs why stream attempt ended, at ztunnel's levels: a connection
// failure or an unexpected gRPC status is a warning, a stream the server
// closed cleanly too ("XDS client complete"), a routine termination
// (retryDelay's "server went away" statuses) is debug.
func (c *Client) logEnd(attempt int, err error, delay time.Duration) {
	var ce *connError
	switch {
	case err == nil:
		c.logf(slog.LevelWarn, "xds: stream %d complete, reconnecting", attempt)
	case errors.As(err, &ce):
		c.logf(slog.LevelWarn, "xds: connection error: %v; retrying in %v", ce.err, delay)
	case delay == initialBackoff:
		c.logf(slog.LevelDebug, "xds: stream %d terminated: %v; retrying in %v", attempt, err, delay)
	default:
		c.logf(slog.LevelWarn, "xds: stream %d error: %v; retrying in %v", attempt, err, delay)
	}
}

// connError is a failure to establish the stream.
type connError struct{ err error }

func (e *connError) Error() string { return "connecting: " + e.err.Error() }
func (e *connError) Unwrap() error { return e.err }

// retryDelay returns how long to wait after a stream ended with err, and the
// backoff to carry to the next failure, following ztunnel: connection
// failures and unexpected gRPC statuses double the backoff (capped); statuses
// that mean "the server went away" (Unknown, Canceled, DeadlineExceeded,
// Unavailable with "transport is closing" or "received prior goaway") wait
// the initial backoff; a clean end or any other error reconnects at once.
func retryDelay(err error, backoff time.Duration) (delay, next time.Duration) {
	if err == nil {
		return 0, initialBackoff
	}
	var ce *connError
	if errors.As(err, &ce) {
		next = min(maxBackoff, 2*backoff)
		return next, next
	}
	st, ok := status.FromError(err)
	if !ok {
		return 0, initialBackoff
	}
	switch {
	case st.Code() == codes.Unknown, st.Code() == codes.Canceled, st.Code() == codes.DeadlineExceeded,
		st.Code() == codes.Unavailable && (strings.Contains(st.Message(), "transport is closing") ||
			strings.Contains(st.Message(), "received prior goaway")):
		return initialBackoff, initialBackoff
	}
	next = min(maxBackoff, 2*backoff)
	return next, next
}
