package meta

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ErrBaggage is wrapped by every baggage parse error.
var ErrBaggage = errors.New("meta: invalid baggage header")

// W3C baggage limits: a header longer than this, or with more members, is
// refused whole rather than read partly.
const (
	MaxBaggageLen     = 8192
	MaxBaggageMembers = 180
)

// Member is one baggage list member; properties are checked and dropped.
type Member struct {
	Key, Value string // Value percent-decoded
}

// ParseMembers parses a baggage header value (several lines joined with
// ","). Empty list members are skipped.
func ParseMembers(s string) ([]Member, error) {
	if len(s) > MaxBaggageLen {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrBaggage, len(s), MaxBaggageLen)
	}
	var out []Member
	for part := range strings.SplitSeq(s, ",") {
		part = trimOWS(part)
		if part == "" {
			continue
		}
		if len(out) == MaxBaggageMembers {
			return nil, fmt.Errorf("%w: more than %d members", ErrBaggage, MaxBaggageMembers)
		}
		kv, _, _ := strings.Cut(part, ";") // properties follow the first ';'
		rest := part[len(kv):]
		m, err := parseKV(kv, true)
		if err != nil {
			return nil, err
		}
		for prop := range strings.SplitSeq(rest, ";") {
			if prop = trimOWS(prop); prop == "" {
				continue
			}
			if _, err := parseKV(prop, false); err != nil {
				return nil, err
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// parseKV reads key OWS "=" OWS value; a property may be a bare key.
func parseKV(s string, needValue bool) (Member, error) {
	k, v, hasEq := strings.Cut(s, "=")
	k, v = trimOWS(k), trimOWS(v)
	if !isToken(k) {
		return Member{}, fmt.Errorf("%w: key %q is not a token", ErrBaggage, k)
	}
	if !hasEq {
		if needValue {
			return Member{}, fmt.Errorf("%w: member %q has no value", ErrBaggage, k)
		}
		return Member{Key: k}, nil
	}
	for i := 0; i < len(v); i++ {
		if !isBaggageOctet(v[i]) {
			return Member{}, fmt.Errorf("%w: byte %#x in the value of %q", ErrBaggage, v[i], k)
		}
	}
	dec, err := url.PathUnescape(v)
	if err != nil {
		return Member{}, fmt.Errorf("%w: value of %q: %w", ErrBaggage, k, err)
	}
	return Member{Key: k, Value: dec}, nil
}

// isBaggageOctet is the W3C baggage-octet set: printable ASCII except
// space, '"', ',', ';' and '\'.
func isBaggageOctet(c byte) bool {
	return c > ' ' && c < 0x7f && c != '"' && c != ',' && c != ';' && c != '\\'
}

func trimOWS(s string) string { return strings.Trim(s, " \t") }

// Baggage is the workload description ztunnel sends in baggage on CONNECT
// and in the 200 response, and reads for telemetry of connections that
// came through a network gateway.
type Baggage struct {
	ClusterID      string // k8s.cluster.name
	Namespace      string // k8s.namespace.name
	WorkloadType   string // the <type> of k8s.<type>.name, e.g. "deployment"
	WorkloadName   string // the value of k8s.<type>.name
	ServiceName    string // service.name (the canonical name)
	ServiceVersion string // service.version (the canonical revision)
	Region         string // cloud.region
	Zone           string // cloud.availability_zone
}

// ParseBaggage reads the workload keys from a baggage header value; other
// keys are ignored. The first k8s.<type>.name key that names a workload
// kind wins.
func ParseBaggage(s string) (Baggage, error) {
	members, err := ParseMembers(s)
	if err != nil {
		return Baggage{}, err
	}
	var b Baggage
	for _, m := range members {
		if m.Value == "" { // an empty value says nothing, as String omits it
			continue
		}
		switch m.Key {
		case "k8s.cluster.name":
			b.ClusterID = m.Value
		case "k8s.namespace.name":
			b.Namespace = m.Value
		case "service.name":
			b.ServiceName = m.Value
		case "service.version":
			b.ServiceVersion = m.Value
		case "cloud.region":
			b.Region = m.Value
		case "cloud.availability_zone":
			b.Zone = m.Value
		default:
			if t, ok := workloadKind(m.Key); ok && b.WorkloadType == "" {
				b.WorkloadType, b.WorkloadName = t, m.Value
			}
		}
	}
	return b, nil
}

// workloadKind returns <type> for a key k8s.<type>.name naming a workload
// kind (not the cluster, namespace, node or container).
func workloadKind(key string) (string, bool) {
	t, ok := strings.CutPrefix(key, "k8s.")
	if !ok {
		return "", false
	}
	if t, ok = strings.CutSuffix(t, ".name"); !ok || t == "" || strings.Contains(t, ".") {
		return "", false
	}
	switch t {
	case "cluster", "namespace", "node", "container":
		return "", false
	}
	return t, true
}

// String formats b as a baggage header value in ztunnel's key order,
// omitting empty values and percent-encoding the rest as needed.
func (b Baggage) String() string {
	var sb strings.Builder
	add := func(k, v string) {
		if v == "" {
			return
		}
		if sb.Len() > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(k)
		sb.WriteByte('=')
		sb.WriteString(escapeBaggage(v))
	}
	add("k8s.cluster.name", b.ClusterID)
	add("k8s.namespace.name", b.Namespace)
	if isToken(b.WorkloadType) && !strings.Contains(b.WorkloadType, ".") {
		add("k8s."+b.WorkloadType+".name", b.WorkloadName)
	}
	add("service.name", b.ServiceName)
	add("service.version", b.ServiceVersion)
	add("cloud.region", b.Region)
	add("cloud.availability_zone", b.Zone)
	return sb.String()
}

// escapeBaggage percent-encodes the bytes that are not baggage-octets, and
// '%' itself so decoding gives the value back.
func escapeBaggage(v string) string {
	const hex = "0123456789ABCDEF"
	var sb strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if isBaggageOctet(c) && c != '%' {
			sb.WriteByte(c)
			continue
		}
		sb.WriteByte('%')
		sb.WriteByte(hex[c>>4])
		sb.WriteByte(hex[c&15])
	}
	return sb.String()
}
