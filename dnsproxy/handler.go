package dnsproxy

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel/metrics"
)

// headerLen is the size of a DNS message header.
const headerLen = 12

// localEDNSSize is the UDP payload size our own answers advertise.
const localEDNSSize = 1232

// forwardReq is a decoded query that no local name answers and that goes
// to the upstream resolvers: what prepare leaves for resolve.
type forwardReq struct {
	req    *dns.Msg
	tcp    bool
	labels metrics.DNSLabels
	client string // the client workload's name, for the access log
	ns     string // the client's namespace, likewise
}

// prepare decodes one query given as wire bytes and answers it when that
// needs no upstream: it returns the reply's wire bytes, or a forwardReq
// when only the upstream resolvers can answer. Both nil means send
// nothing: bytes too short for a header, and responses (answering those
// could loop between two servers). It is a snapshot read, with no I/O, so
// the serve loops run it before spending any forwarding budget. It never
// panics on any input.
func (s *Server) prepare(ctx context.Context, raw []byte, tcp bool) ([]byte, *forwardReq) {
	if len(raw) < headerLen || raw[2]&0x80 != 0 {
		return nil, nil
	}
	req := new(dns.Msg)
	if err := req.Unpack(raw); err != nil {
		return formErr(raw), nil
	}
	if req.Opcode != dns.OpcodeQuery {
		return s.pack(errorReply(req, dns.RcodeNotImplemented), req, tcp), nil
	}
	if len(req.Question) != 1 {
		return s.pack(errorReply(req, dns.RcodeFormatError), req, tcp), nil
	}
	q := req.Question[0]
	snap := s.cfg.State.Load()
	v := view{
		snap: snap, ns: s.cfg.Client.Namespace, network: s.cfg.Network,
		domain: s.cfg.Domain, svcDomain: s.svcDomain, search: s.search, preferNS: s.cfg.PreferredNamespace,
	}
	labels := metrics.DNSLabels{QueryType: strings.ToLower(dns.TypeToString[q.Qtype]), Protocol: "udp"}
	if tcp {
		labels.Protocol = "tcp"
	}
	var client string
	if w := snap.FindWorkload(s.cfg.Client); w != nil {
		// The workload's own record is authoritative; before it arrives the
		// proxy still answers, with the namespace it was started for.
		v.ns, v.network = w.Namespace(), w.Network()
		labels.SourceCanonicalService, labels.SourceCanonicalRevision = w.CanonicalName(), w.CanonicalRevision()
		client = w.Name
	}
	s.cfg.Metrics.DNSRequest(labels)

	if q.Qclass == dns.ClassINET && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeAAAA) {
		qname := lowerASCII(trimDot(q.Name))
		if m, ok := v.find(qname); ok {
			if q.Qtype == dns.TypeAAAA && s.cfg.IPv4Only {
				// The host exists, IPv6 does not: empty, not NXDOMAIN.
				s.accessLog(ctx, client, v.ns, q, "service does not support this record type", 0)
				return s.pack(emptyReply(req), req, tcp), nil
			}
			resp, n := v.localReply(req, m, q.Qtype == dns.TypeAAAA)
			s.accessLog(ctx, client, v.ns, q, "success", n)
			return s.pack(resp, req, tcp), nil
		}
	}
	return nil, &forwardReq{req: req, tcp: tcp, labels: labels, client: client, ns: v.ns}
}

// resolve asks the upstream resolvers for f and returns the reply's wire
// bytes: their answer, or SERVFAIL when none gave one. The caller holds a
// forwarding slot for the whole exchange.
func (s *Server) resolve(ctx context.Context, f *forwardReq) []byte {
	q := f.req.Question[0]
	resp, err := s.forward(ctx, f.req, f.tcp, f.labels)
	if err != nil {
		s.accessLog(ctx, f.client, f.ns, q, "forwarding failed ("+err.Error()+")", 0)
		return s.pack(errorReply(f.req, dns.RcodeServerFailure), f.req, f.tcp)
	}
	s.accessLog(ctx, f.client, f.ns, q, "forwarded", len(resp.Answer))
	return s.pack(resp, f.req, f.tcp)
}

// refuse answers f SERVFAIL without asking upstream: no forwarding slot
// was free for it.
func (s *Server) refuse(ctx context.Context, f *forwardReq) []byte {
	s.accessLog(ctx, f.client, f.ns, f.req.Question[0], "forwarding refused (too many queries in flight)", 0)
	return s.pack(errorReply(f.req, dns.RcodeServerFailure), f.req, f.tcp)
}

// localReply builds the authoritative answer for a matched name and returns
// it with its number of address records.
func (v *view) localReply(req *dns.Msg, m match, v6 bool) (*dns.Msg, int) {
	resp := emptyReply(req)
	addrs := v.addresses(m, v6)
	if len(addrs) == 0 {
		// The host exists: an empty NOERROR, not NXDOMAIN, so the client
		// does not give up on the other family.
		return resp, 0
	}
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })

	qname := req.Question[0].Name
	owner := qname
	if m.alias.stripped != "" && !strings.HasPrefix(m.name, "*.") {
		// Found after removing a search domain: point the asked name at the
		// name that matched, keeping the client's spelling.
		owner = dns.Fqdn(qname[:len(m.alias.stripped)])
		resp.Answer = append(resp.Answer, &dns.CNAME{
			Hdr:    dns.RR_Header{Name: qname, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: TTL},
			Target: owner,
		})
	}
	for _, a := range addrs {
		if v6 {
			resp.Answer = append(resp.Answer, &dns.AAAA{
				Hdr:  dns.RR_Header{Name: owner, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: TTL},
				AAAA: net.IP(a.AsSlice()),
			})
		} else {
			resp.Answer = append(resp.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: TTL},
				A:   net.IP(a.AsSlice()),
			})
		}
	}
	return resp, len(addrs)
}

// emptyReply is the authoritative NOERROR reply to req without records,
// which localReply fills.
func emptyReply(req *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Authoritative = true
	resp.RecursionAvailable = true
	return resp
}

// errorReply is an empty reply to req with rcode.
func errorReply(req *dns.Msg, rcode int) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetRcode(req, rcode)
	resp.RecursionAvailable = true
	return resp
}

// formErr answers a query that does not decode: the header's id and opcode
// with FORMERR and nothing else.
func formErr(raw []byte) []byte {
	m := dns.Msg{MsgHdr: dns.MsgHdr{
		Id:               uint16(raw[0])<<8 | uint16(raw[1]),
		Response:         true,
		Opcode:           int(raw[2]>>3) & 0xf,
		RecursionDesired: raw[2]&1 != 0,
		Rcode:            dns.RcodeFormatError,
	}}
	out, err := m.Pack()
	if err != nil {
		return nil
	}
	return out
}

// pack encodes resp for the client: over UDP it must fit the size the
// client accepts (512 bytes, or its EDNS size), else it is truncated with TC
// set; a client that sent EDNS gets an OPT record back.
func (s *Server) pack(resp, req *dns.Msg, tcp bool) []byte {
	size := dns.MaxMsgSize
	if opt := req.IsEdns0(); opt != nil {
		if resp.IsEdns0() == nil {
			resp.SetEdns0(localEDNSSize, opt.Do())
		}
		if !tcp {
			size = max(int(opt.UDPSize()), dns.MinMsgSize)
		}
	} else if !tcp {
		size = dns.MinMsgSize
	}
	resp.Truncate(size)
	out, err := resp.Pack()
	if err != nil {
		// Only a reply we could not encode (an upstream's odd record):
		// tell the client rather than go silent.
		out, err = errorReply(req, dns.RcodeServerFailure).Pack()
		if err != nil {
			return nil
		}
	}
	return out
}

// accessLog writes ztunnel's per-request debug line.
func (s *Server) accessLog(ctx context.Context, client, ns string, q dns.Question, result string, n int) {
	if !s.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	if client == "" {
		client = "unknown"
	}
	s.log.Debug("dns request", "src.workload", client, "src.namespace", ns,
		"query", dns.TypeToString[q.Qtype], "domain", q.Name, "result", result, "endpoints", n)
}
