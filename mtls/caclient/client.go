package caclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// DefaultTTL is the certificate lifetime requested when Config.TTL is zero,
// ztunnel's SECRET_TTL default.
const DefaultTTL = 24 * time.Hour

// Signer turns a CSR into a certificate chain in the Istio CA response
// format: the leaf first, intermediates next, the root bundle last.
type Signer interface {
	// Sign signs csrPEM for ttl. A non-zero impersonate names the identity
	// the caller asks for on behalf of a workload (ztunnel's
	// ImpersonatedIdentity metadata); the zero value means the caller's own.
	Sign(ctx context.Context, csrPEM []byte, ttl time.Duration, impersonate identity.Identity) ([]string, error)
}

// Config configures a Client.
type Config struct {
	// Signer signs the CSRs. Required.
	Signer Signer
	// TTL is the validity requested for each certificate. Zero means
	// DefaultTTL (24h).
	TTL time.Duration
	// Impersonate asks the Signer to issue for the requested identity rather
	// than the caller's own, as shared (in-pod) mode does for every pod.
	Impersonate bool
}

// Client issues workload certificates through a Signer. It implements
// mtls.Source and is safe for concurrent use.
type Client struct {
	signer      Signer
	ttl         time.Duration
	impersonate bool
}

var _ mtls.Source = (*Client)(nil)

// New returns a Client for cfg.
func New(cfg Config) *Client {
	if cfg.Signer == nil {
		panic("caclient: New without a Signer")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	return &Client{signer: cfg.Signer, ttl: cfg.TTL, impersonate: cfg.Impersonate}
}

// Fetch generates a fresh ECDSA P-256 key and CSR for id, has the Signer
// sign it, and parses the answer with mtls.ParseChain, which rejects a
// certificate for any identity but id (mtls.ErrIdentityMismatch).
func (c *Client) Fetch(ctx context.Context, id identity.Identity) (*mtls.WorkloadCert, error) {
	if id.IsZero() {
		return nil, errors.New("caclient: fetch for the empty identity")
	}
	key, csrPEM, err := newCSR(id)
	if err != nil {
		return nil, err
	}
	var imp identity.Identity
	if c.impersonate {
		imp = id
	}
	chain, err := c.signer.Sign(ctx, csrPEM, c.ttl, imp)
	if err != nil {
		return nil, fmt.Errorf("caclient: signing certificate for %s: %w", id, err)
	}
	wc, err := mtls.ParseChain(chain, key, id)
	if err != nil {
		return nil, fmt.Errorf("caclient: certificate for %s: %w", id, err)
	}
	return wc, nil
}

// newCSR generates an ECDSA P-256 key and a PEM CSR for id in the form
// ztunnel sends: signed with SHA-256, an empty subject (no CN), and a single
// URI SAN, the SPIFFE ID. The key never leaves memory; a caller that must
// store it can marshal it as PKCS#8 with x509.MarshalPKCS8PrivateKey.
func newCSR(id identity.Identity) (*ecdsa.PrivateKey, []byte, error) {
	u, err := url.Parse(id.String())
	if err != nil {
		return nil, nil, fmt.Errorf("caclient: identity %s as uri: %w", id, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("caclient: generating key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		SignatureAlgorithm: x509.ECDSAWithSHA256,
		URIs:               []*url.URL{u},
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("caclient: creating csr: %w", err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}
