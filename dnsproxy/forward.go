package dnsproxy

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel/metrics"
)

// ErrNoUpstream is returned for a forwarded question when no upstream
// resolver is configured.
var ErrNoUpstream = errors.New("dnsproxy: no upstream resolver")

// ResolvConf is what the proxy takes from a resolv.conf file.
type ResolvConf struct {
	// Servers are the nameservers as "host:port".
	Servers []string
	// Search is the search list, without trailing dots.
	Search []string
	// Timeout and Attempts are its "options timeout:n attempts:n": how
	// long one exchange with one nameserver may take, and how many rounds
	// through the nameservers a query gets. Unset, 5 s and 2, the defaults
	// of resolv.conf(5) and of ztunnel's resolver (hickory's, read from the
	// same file).
	Timeout  time.Duration
	Attempts int
}

// ReadResolvConf reads the nameservers and search list of a resolv.conf
// file (ztunnel reads its own /etc/resolv.conf once, at start).
func ReadResolvConf(path string) (ResolvConf, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return ResolvConf{}, fmt.Errorf("dnsproxy: %w", err)
	}
	rc := ResolvConf{Timeout: time.Duration(cc.Timeout) * time.Second, Attempts: cc.Attempts}
	for _, srv := range cc.Servers {
		rc.Servers = append(rc.Servers, net.JoinHostPort(srv, cc.Port))
	}
	for _, d := range cc.Search {
		if d = trimDot(d); d != "" {
			rc.Search = append(rc.Search, d)
		}
	}
	return rc, nil
}

// nameserver is one upstream resolver and its record.
type nameserver struct {
	addr string
	// failures counts the exchanges that failed since the last one that
	// did not: a dead resolver is tried after those that answer, so that it
	// does not hold every forwarded query (and its slot) for a timeout.
	failures atomic.Uint32
}

// maxFailures caps nameserver.failures far below overflow.
const maxFailures = 1 << 30

// forwarder asks the upstream resolvers, with a cache of their answers: the
// DNS proxy's (one per workload, its sockets in the workload's namespace)
// and the on-demand Resolver's.
type forwarder struct {
	upstreams []*nameserver
	dial      func(ctx context.Context, network, address string) (net.Conn, error)
	control   func(fn func() error) error // nil: dial as it is
	timeout   time.Duration               // one exchange with one upstream
	attempts  int                         // rounds through the upstreams
	cache     *answerCache                // nil: none
}

func newForwarder(upstreams []string, dial func(ctx context.Context, network, address string) (net.Conn, error),
	control func(fn func() error) error, timeout time.Duration, attempts, cacheSize int) *forwarder {
	f := &forwarder{dial: dial, control: control, timeout: timeout, attempts: max(attempts, 1)}
	for _, u := range upstreams {
		f.upstreams = append(f.upstreams, &nameserver{addr: u})
	}
	if cacheSize > 0 {
		f.cache = newAnswerCache(cacheSize, time.Now)
	}
	return f
}

// order returns the upstreams in the order to try them: the fewest
// consecutive failures first, resolv.conf's order among equals. A dead one
// is tried again when the others fail as often, or first when it is alone.
func (f *forwarder) order() []*nameserver {
	type ranked struct {
		u     *nameserver
		fails uint32
	}
	rs := make([]ranked, len(f.upstreams))
	for i, u := range f.upstreams {
		rs[i] = ranked{u, u.failures.Load()}
	}
	slices.SortStableFunc(rs, func(a, b ranked) int { return cmp.Compare(a.fails, b.fails) })
	out := make([]*nameserver, len(rs))
	for i, r := range rs {
		out[i] = r.u
	}
	return out
}

// forward answers req from the cache or by asking the upstream resolvers
// (forwarder.ask), and returns the answer with the client's id. Only what
// goes upstream is counted in the upstream metrics. An upstream reply
// truncated over UDP is asked again over TCP, as ztunnel's resolver does
// (hickory retries a truncated reply over TCP): the client gets the whole
// answer cut to its own UDP size by pack, not the upstream's cut (which may
// hold no record at all), and the cache keeps the whole answer.
func (s *Server) forward(ctx context.Context, req *dns.Msg, tcp bool, labels metrics.DNSLabels) (*dns.Msg, error) {
	if resp := s.fw.cache.get(req); resp != nil {
		return resp, nil
	}
	s.cfg.Metrics.DNSUpstreamRequest(labels)
	start := time.Now()
	defer func() { s.cfg.Metrics.DNSUpstreamDuration(labels, time.Since(start)) }()

	resp, err := s.fw.ask(ctx, req, tcp)
	if err == nil && !tcp && resp.Truncated {
		resp, err = s.fw.ask(ctx, req, true)
	}
	if err != nil {
		s.cfg.Metrics.DNSUpstreamFailure(labels)
		return nil, err
	}
	return resp, nil
}

// lookup is forward without metrics, for the Resolver.
func (f *forwarder) lookup(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	if resp := f.cache.get(req); resp != nil {
		return resp, nil
	}
	resp, err := f.ask(ctx, req, false)
	if err == nil && resp.Truncated {
		resp, err = f.ask(ctx, req, true)
	}
	return resp, err
}

// ask sends req to the upstream resolvers in turn (order's), attempts
// rounds at most, over TCP when the client asked over TCP, and returns the
// first answer, with the client's id, keeping it in the cache. Upstream
// sees a fresh random id so that it cannot be guessed from the client's.
func (f *forwarder) ask(ctx context.Context, req *dns.Msg, tcp bool) (*dns.Msg, error) {
	if len(f.upstreams) == 0 {
		return nil, ErrNoUpstream
	}
	out := req.Copy()
	out.Id = dns.Id()
	wire, err := out.Pack()
	if err != nil {
		return nil, fmt.Errorf("dnsproxy: encode upstream query: %w", err)
	}
	var errs []error
	for range f.attempts {
		for _, up := range f.order() {
			resp, err := f.exchange(ctx, up.addr, wire, out, tcp)
			if err == nil {
				up.failures.Store(0)
				f.cache.put(req, resp)
				resp.Id = req.Id
				return resp, nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", up.addr, err))
			if ctx.Err() != nil {
				return nil, errors.Join(errs...) // the server closes: not the upstream's failure
			}
			if up.failures.Load() < maxFailures {
				up.failures.Add(1)
			}
		}
	}
	return nil, errors.Join(errs...)
}

// exchange asks one upstream, bounded by the timeout. Over UDP, replies
// that do not answer our query (another id or question) are skipped until
// the deadline, so a stray or spoofed datagram cannot answer it.
func (f *forwarder) exchange(ctx context.Context, upstream string, wire []byte, q *dns.Msg, tcp bool) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	network := "udp"
	if tcp {
		network = "tcp"
	}
	var (
		c   net.Conn
		err error
	)
	dial := func() error { c, err = f.dial(ctx, network, upstream); return nil }
	if f.control != nil {
		if cerr := f.control(dial); cerr != nil {
			return nil, cerr
		}
	} else {
		dial()
	}
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// Close wakes a blocked read when the server closes; the deadline
	// covers the timeout.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)

	if tcp {
		msg := make([]byte, 2+len(wire))
		binary.BigEndian.PutUint16(msg, uint16(len(wire)))
		copy(msg[2:], wire)
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		var hdr [2]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return nil, err
		}
		buf := make([]byte, binary.BigEndian.Uint16(hdr[:]))
		if _, err := io.ReadFull(c, buf); err != nil {
			return nil, err
		}
		return checkReply(buf, q)
	}
	if _, err := c.Write(wire); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		if resp, err := checkReply(buf[:n], q); err == nil {
			return resp, nil
		}
	}
}

// checkReply decodes an upstream reply and checks that it answers q.
func checkReply(raw []byte, q *dns.Msg) (*dns.Msg, error) {
	resp := new(dns.Msg)
	if err := resp.Unpack(raw); err != nil {
		return nil, fmt.Errorf("bad reply: %w", err)
	}
	if !resp.Response || resp.Id != q.Id {
		return nil, errors.New("reply does not match the query")
	}
	// A truncated reply may carry no question; otherwise it must be ours.
	if len(resp.Question) > 0 {
		a, b := resp.Question[0], q.Question[0]
		if a.Qtype != b.Qtype || a.Qclass != b.Qclass || !strings.EqualFold(a.Name, b.Name) {
			return nil, errors.New("reply is for another question")
		}
	}
	return resp, nil
}
