// Package identity parses and formats the SPIFFE identities of Istio workloads,
// spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>.
//
// It is a leaf: it imports only the standard library, so that both the policy
// table (state) and the certificate code (mtls) can share one identity type
// without importing each other. Imports (of ours): nothing of ours. Imported
// by: bench/load, internal/app, internal/labrun, mtls, mtls/caclient,
// mtls/caclient/catest, mtls/tlstest, proxy, state, state/xdsconv and tests.
package identity

import (
	"errors"
	"fmt"
	"strings"
)

// Scheme is the URI scheme of every SPIFFE ID.
const Scheme = "spiffe://"

// DefaultTrustDomain is the trust domain Istio uses when none is configured.
const DefaultTrustDomain = "cluster.local"

// ErrMalformed is returned for any string that is not an Istio SPIFFE identity.
var ErrMalformed = errors.New("identity: malformed spiffe identity")

// Identity is an Istio workload identity. The zero value means "no identity"
// (a plaintext peer); it formats as the empty string.
type Identity struct {
	TrustDomain    string
	Namespace      string
	ServiceAccount string
}

// New returns the identity of service account sa in namespace ns under trust
// domain td; an empty td means DefaultTrustDomain and an empty sa means "default",
// as Istio fills them for workloads.
func New(td, ns, sa string) Identity {
	if td == "" {
		td = DefaultTrustDomain
	}
	if sa == "" {
		sa = "default"
	}
	return Identity{TrustDomain: td, Namespace: ns, ServiceAccount: sa}
}

// Parse parses a SPIFFE URI exactly as ztunnel's Identity::from_str does,
// whether the string comes from a peer's certificate or from configuration:
// the scheme is "spiffe://", case-sensitive (a URI SAN "SPIFFE://..." is not
// an identity, although RFC 3986 calls schemes case-insensitive and Go's
// url.URL lower-cases them), then exactly five '/'-separated segments: td,
// "ns", namespace, "sa", service account. Nothing else is checked, so, as in
// ztunnel, segments may be empty ("spiffe://td/ns//sa/" is trust domain td,
// namespace "" and service account "") and may hold any other character.
//
// "spiffe:///ns//sa/", all three empty, parses to the zero Identity, which
// every caller reads as "no identity" (ztunnel would see an identity that no
// policy or trust domain names): the one place this package is stricter.
func Parse(s string) (Identity, error) {
	rest, ok := strings.CutPrefix(s, Scheme)
	if !ok {
		return Identity{}, fmt.Errorf("%w: %q lacks the %s scheme", ErrMalformed, s, Scheme)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 5 || parts[1] != "ns" || parts[3] != "sa" {
		return Identity{}, fmt.Errorf("%w: %q is not spiffe://<td>/ns/<ns>/sa/<sa>", ErrMalformed, s)
	}
	return Identity{TrustDomain: parts[0], Namespace: parts[2], ServiceAccount: parts[4]}, nil
}

// IsZero reports whether id is the absent identity.
func (id Identity) IsZero() bool { return id == Identity{} }

// String returns the SPIFFE URI, or "" for the zero identity.
func (id Identity) String() string {
	if id.IsZero() {
		return ""
	}
	return Scheme + id.Principal()
}

// Principal returns the identity without its scheme (td/ns/N/sa/S), the form
// authorization policies match principals against; "" for the zero identity.
func (id Identity) Principal() string {
	if id.IsZero() {
		return ""
	}
	return id.TrustDomain + "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount
}
