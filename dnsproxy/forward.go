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
}

// ReadResolvConf reads the nameservers and search list of a resolv.conf
// file (ztunnel reads its own /etc/resolv.conf once, at start).
func ReadResolvConf(path string) (ResolvConf, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return ResolvConf{}, fmt.Errorf("dnsproxy: %w", err)
	}
	var rc ResolvConf
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

// order returns the upstreams in the order to try them: the fewest
// consecutive failures first, resolv.conf's order among equals. A dead one
// is tried again when the others fail as often, or first when it is alone.
func (s *Server) order() []*nameserver {
	type ranked struct {
		u     *nameserver
		fails uint32
	}
	rs := make([]ranked, len(s.upstreams))
	for i, u := range s.upstreams {
		rs[i] = ranked{u, u.failures.Load()}
	}
	slices.SortStableFunc(rs, func(a, b ranked) int { return cmp.Compare(a.fails, b.fails) })
	out := make([]*nameserver, len(rs))
	for i, r := range rs {
		out[i] = r.u
	}
	return out
}

// forward sends req to the upstream resolvers in turn (order's), over TCP
// when the client asked over TCP, and returns the first answer, with the
// client's id. Upstream sees a fresh random id so that it cannot be guessed
// from the client's.
func (s *Server) forward(ctx context.Context, req *dns.Msg, tcp bool, labels metrics.DNSLabels) (*dns.Msg, error) {
	s.cfg.Metrics.DNSUpstreamRequest(labels)
	start := time.Now()
	defer func() { s.cfg.Metrics.DNSUpstreamDuration(labels, time.Since(start)) }()

	resp, err := s.exchangeAll(ctx, req, tcp)
	if err != nil {
		s.cfg.Metrics.DNSUpstreamFailure(labels)
		return nil, err
	}
	return resp, nil
}

func (s *Server) exchangeAll(ctx context.Context, req *dns.Msg, tcp bool) (*dns.Msg, error) {
	if len(s.upstreams) == 0 {
		return nil, ErrNoUpstream
	}
	out := req.Copy()
	out.Id = dns.Id()
	wire, err := out.Pack()
	if err != nil {
		return nil, fmt.Errorf("dnsproxy: encode upstream query: %w", err)
	}
	var errs []error
	for _, up := range s.order() {
		resp, err := s.exchange(ctx, up.addr, wire, out, tcp)
		if err == nil {
			up.failures.Store(0)
			resp.Id = req.Id
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up.addr, err))
		if ctx.Err() != nil {
			break // the server closes: not the upstream's failure
		}
		if up.failures.Load() < maxFailures {
			up.failures.Add(1)
		}
	}
	return nil, errors.Join(errs...)
}

// exchange asks one upstream, bounded by UpstreamTimeout. Over UDP, replies
// that do not answer our query (another id or question) are skipped until
// the deadline, so a stray or spoofed datagram cannot answer it.
func (s *Server) exchange(ctx context.Context, upstream string, wire []byte, q *dns.Msg, tcp bool) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.UpstreamTimeout)
	defer cancel()
	network := "udp"
	if tcp {
		network = "tcp"
	}
	var (
		c   net.Conn
		err error
	)
	cerr := s.control(func() error { c, err = s.cfg.Dial(ctx, network, upstream); return nil })
	if cerr != nil {
		return nil, cerr
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
