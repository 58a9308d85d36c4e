package xdsclient

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/ztunnel-go/ztunnel/controlplane"
)

// runStream runs one ADS stream until it ends. It returns nil when the server
// ended it cleanly.
func (c *Client) runStream(ctx context.Context, cpCfg controlplane.Config, attempt int) error {
	// Say why before dialing: a root file that is not there (yet) or holds
	// no certificate would otherwise surface as a TLS handshake failure.
	if err := controlplane.CheckRoots(cpCfg.RootCA); err != nil {
		return &connError{err}
	}
	cc, err := c.dial(cpCfg)
	if err != nil {
		return &connError{err}
	}
	defer cc.Close()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(sctx)
	if err != nil {
		return &connError{err}
	}

	// The reader goroutine is owned by this call: it ends when the stream
	// fails or sctx is cancelled, and is waited for before returning.
	responses := make(chan *discoveryv3.DeltaDiscoveryResponse)
	recvErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case responses <- r:
			case <-sctx.Done():
				return
			}
		}
	})
	defer wg.Wait()
	defer cancel()

	// After a failed Send the stream's real status comes from Recv.
	sendFailed := func(err error) error {
		if errors.Is(err, io.EOF) {
			select {
			case err = <-recvErr:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return streamEnd(err)
	}
	for _, t := range c.types {
		req := c.initialRequest(t)
		if err := stream.Send(req); err != nil {
			return sendFailed(err)
		}
	}
	c.logf(slog.LevelInfo, "xds: stream %d established to %s", attempt, c.cfg.Address)

	for {
		// Wait for the next event; only when none is ready at once,
		// merge what the last responses added to the record of versions
		// held (tens of milliseconds for a push of 100,000 names), so that
		// neither an ACK nor Synced waits for it.
		var err error
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return streamEnd(err)
		case d := <-c.demands:
			err = c.demand(stream, d)
		case r := <-responses:
			err = c.respond(stream, r)
		default:
			c.compactKnown()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case err := <-recvErr:
				return streamEnd(err)
			case d := <-c.demands:
				err = c.demand(stream, d)
			case r := <-responses:
				err = c.respond(stream, r)
			}
		}
		if err != nil {
			return sendFailed(err)
		}
	}
}

// demand asks the server for one resource of an on-demand type.
func (c *Client) demand(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, d demand) error {
	c.logf(slog.LevelInfo, "xds: received on demand request %s/%s", d.key.typeURL, d.key.name)
	c.pending[d.key] = append(c.pending[d.key], d.done)
	if vs := c.knownFor(d.key.typeURL); !vs.has(d.key.name) {
		vs.set(d.key.name, "") // re-asked for on reconnect
	}
	return stream.Send(&discoveryv3.DeltaDiscoveryRequest{
		TypeUrl:                d.key.typeURL,
		ResourceNamesSubscribe: []string{d.key.name},
	})
}

// respond applies one response, sends its ACK or NACK, and closes Synced
// once every expected type has been ACKed.
func (c *Client) respond(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, r *discoveryv3.DeltaDiscoveryResponse) error {
	if c.cfg.OnMessage != nil {
		n := 0
		for _, res := range r.Resources {
			n += len(res.GetResource().GetValue())
		}
		c.cfg.OnMessage(r.TypeUrl, n)
	}
	ack, ok := c.handle(r)
	if err := stream.Send(ack); err != nil {
		return err
	}
	if ok && c.expect[r.TypeUrl] {
		delete(c.expect, r.TypeUrl)
		if len(c.expect) == 0 {
			close(c.synced)
			c.logf(slog.LevelInfo, "xds: synced")
		}
	}
	return nil
}

// compactKnown merges the pending changes of every type's record of
// versions that has enough of them.
func (c *Client) compactKnown() {
	for _, vs := range c.known {
		vs.compact()
	}
}

// streamEnd maps a Recv error to runStream's result: nil for a clean end.
func streamEnd(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func (c *Client) knownFor(typeURL string) *versions {
	vs := c.known[typeURL]
	if vs == nil {
		vs = &versions{}
		c.known[typeURL] = vs
	}
	return vs
}

// initialRequest is the first request of a stream for typeURL: the node, the
// subscription (wildcard, or nothing for an on-demand type: "*" subscribed
// and unsubscribed at once, as ztunnel does) and every version held.
func (c *Client) initialRequest(typeURL string) *discoveryv3.DeltaDiscoveryRequest {
	req := &discoveryv3.DeltaDiscoveryRequest{Node: c.node, TypeUrl: typeURL}
	if c.onDemand[typeURL] {
		req.ResourceNamesSubscribe = []string{"*"}
		req.ResourceNamesUnsubscribe = []string{"*"}
	}
	if known := c.known[typeURL]; known != nil && known.len() > 0 {
		req.InitialResourceVersions = make(map[string]string, known.len())
		known.all(func(name, version string) { req.InitialResourceVersions[name] = version })
	}
	return req
}

// handle applies one response and returns the ACK or NACK for it, and
// whether it is an ACK.
func (c *Client) handle(r *discoveryv3.DeltaDiscoveryResponse) (*discoveryv3.DeltaDiscoveryRequest, bool) {
	reply := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce}
	h := c.handlers[r.TypeUrl]
	if h == nil {
		// As ztunnel: log and ACK a type nobody asked for.
		c.logf(slog.LevelError, "xds: response for unknown type %s (nonce %s); acknowledging", r.TypeUrl, r.Nonce)
		return reply, true
	}

	u := &Update{TypeURL: r.TypeUrl, Resources: make([]Resource, 0, len(r.Resources)), Removed: r.RemovedResources}
	var missing []Rejection
	for _, res := range r.Resources {
		if res.GetResource() == nil {
			missing = append(missing, Rejection{Name: res.GetName(), Err: errors.New("xds payload without resource")})
			continue
		}
		// The name and version outlive the response (the record of
		// versions keeps both, and the handler may keep the name: a
		// workload's uid is its resource name). Copies made here, in a
		// loop that allocates nothing else, pack a large push's names
		// densely; the decoded strings sit between the response's type
		// URLs and payloads, which die with it, and would keep each of
		// their spans mostly empty for as long as the resource is held.
		u.Resources = append(u.Resources, Resource{Name: strings.Clone(res.Name), Version: strings.Clone(res.Version), Value: res.Resource})
	}
	held := u.Resources // the copies, in the response's order
	rejected := append(h.Handle(u), missing...)

	// Bookkeeping after the handler, so that woken lookups see its result.
	// Rejected resources are not recorded as held: on reconnect the server
	// must send them again.
	var rejectedNames map[string]bool
	if len(rejected) > 0 {
		rejectedNames = make(map[string]bool, len(rejected))
		for _, rj := range rejected {
			rejectedNames[rj.Name] = true
		}
	}
	known := c.knownFor(r.TypeUrl)
	for _, name := range r.RemovedResources {
		known.remove(name)
		c.notify(resourceKey{r.TypeUrl, name})
	}
	for _, res := range r.Resources {
		name, version := res.GetName(), res.GetVersion()
		if res.GetResource() != nil {
			name, version = held[0].Name, held[0].Version
			held = held[1:]
		}
		c.notify(resourceKey{r.TypeUrl, name})
		// istiod answers an on-demand "network/IP" with the resource under
		// its own name and the asked-for name as an alias.
		for _, a := range res.GetAliases() {
			c.notify(resourceKey{r.TypeUrl, a})
		}
		if !rejectedNames[name] {
			known.set(name, version)
		}
	}

	if len(rejected) == 0 {
		return reply, true
	}
	msgs := make([]string, len(rejected))
	for i, rj := range rejected {
		msgs[i] = rj.Error()
	}
	detail := strings.Join(msgs, "; ")
	c.logf(slog.LevelError, "xds: sending NACK for %d resource(s) of %s (nonce %s): %s", len(rejected), r.TypeUrl, r.Nonce, detail)
	reply.ErrorDetail = &rpcstatus.Status{Message: detail}
	return reply, false
}

func (c *Client) notify(k resourceKey) {
	for _, ch := range c.pending[k] {
		close(ch)
	}
	delete(c.pending, k)
}
