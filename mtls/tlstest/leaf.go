package tlstest

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// LeafOptions shapes an end-entity certificate. The zero value is a P-256
// leaf with no SANs, valid from an hour ago for a day, for server and client
// authentication. An expired leaf is NotAfter in the past; a not-yet-valid
// one NotBefore in the future; a leaf of another trust domain names a SPIFFE
// ID of that trust domain in URIs.
type LeafOptions struct {
	// CommonName is the subject's CN (empty, as Istio's leaves have it, by
	// default).
	CommonName string
	// URIs are URI SANs, usually one SPIFFE ID ("spiffe://td/ns/n/sa/s").
	// crypto/x509 writes each as url.Parse(s).String(), which lower-cases
	// the scheme; RawURIs keeps every byte.
	URIs []string
	// RawURIs are URI SANs written byte for byte after URIs (for example an
	// upper-case "SPIFFE://..." scheme, or a SAN url.URL would re-escape).
	// With RawURIs the SAN extension is built here rather than by
	// crypto/x509: URIs, then RawURIs, then Names, in order.
	RawURIs []string
	// CA marks the leaf a CA in its basic constraints (CA:true), as a
	// hostile peer may present one as its own certificate.
	CA bool
	// Names are DNS names or IP addresses (those that parse as one).
	Names []string
	// NotBefore and NotAfter default to an hour ago and a day from now.
	NotBefore, NotAfter time.Time
	// KeyUsage defaults to DigitalSignature.
	KeyUsage x509.KeyUsage
	// ExtKeyUsage defaults to server and client authentication.
	ExtKeyUsage []x509.ExtKeyUsage
	// Key defaults to a fresh P-256 key.
	Key crypto.Signer
	// Modify, if set, has the last word on the template before signing.
	Modify func(*x509.Certificate)
}

// Leaf is an issued end-entity certificate, its key and the CA chain above
// it.
type Leaf struct {
	// Cert is the leaf certificate.
	Cert *x509.Certificate
	// Key is the leaf's private key.
	Key crypto.Signer
	// Issuer signed the leaf; nil for a self-signed one.
	Issuer *CA
}

// Leaf issues a leaf shaped by o from ca.
func (ca *CA) Leaf(t testing.TB, o LeafOptions) *Leaf {
	t.Helper()
	key, tmpl, err := leafTemplate(o)
	if err != nil {
		t.Fatal(err)
	}
	if o.Modify != nil {
		o.Modify(tmpl)
	}
	return &Leaf{Cert: sign(t, tmpl, ca.Cert, key.Public(), ca.Key), Key: key, Issuer: ca}
}

// SelfSigned returns a self-signed leaf shaped by o that is also its own CA
// (IsCA, CertSign), so that a pool holding it verifies it: the one
// certificate both sides of a test connection can share.
func SelfSigned(t testing.TB, o LeafOptions) *Leaf {
	t.Helper()
	l, err := NewSelfSigned(o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// NewSelfSigned is SelfSigned returning its error rather than failing a
// test: for a certificate made once (sync.OnceValues) and shared by tests,
// benchmarks and fuzz targets, where no one testing.TB owns it.
func NewSelfSigned(o LeafOptions) (*Leaf, error) {
	key, tmpl, err := leafTemplate(o)
	if err != nil {
		return nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage |= x509.KeyUsageCertSign
	if tmpl.Subject.CommonName == "" {
		tmpl.Subject.CommonName = "tlstest self-signed"
	}
	if o.Modify != nil {
		o.Modify(tmpl)
	}
	cert, err := signCert(tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	return &Leaf{Cert: cert, Key: key}, nil
}

func leafTemplate(o LeafOptions) (crypto.Signer, *x509.Certificate, error) {
	key := o.Key
	if key == nil {
		k, err := newKey()
		if err != nil {
			return nil, nil, err
		}
		key = k
	}
	if o.KeyUsage == 0 {
		o.KeyUsage = x509.KeyUsageDigitalSignature
	}
	if o.ExtKeyUsage == nil {
		o.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: o.CommonName},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     o.KeyUsage,
		ExtKeyUsage:  o.ExtKeyUsage,
	}
	for _, s := range o.URIs {
		u, err := url.Parse(s)
		if err != nil {
			return nil, nil, fmt.Errorf("tlstest: URI SAN %q: %w", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	parseNames(tmpl, o.Names)
	if len(o.RawURIs) > 0 {
		ext, err := rawSANExtension(append(append([]string(nil), o.URIs...), o.RawURIs...), tmpl)
		if err != nil {
			return nil, nil, err
		}
		tmpl.ExtraExtensions = append(tmpl.ExtraExtensions, ext)
	}
	if o.CA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	}
	defaultValidity(tmpl)
	return key, tmpl, nil
}

// oidSubjectAltName is the subject alternative name extension (RFC 5280
// section 4.2.1.6).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// rawSANExtension builds the SAN extension of tmpl with the URIs uris
// written as given, then tmpl's DNS names and IP addresses. crypto/x509
// leaves a template's own SAN fields out when ExtraExtensions holds one.
// As crypto/x509 does, the extension is critical when the subject is empty
// (RFC 5280 section 4.2.1.6).
func rawSANExtension(uris []string, tmpl *x509.Certificate) (pkix.Extension, error) {
	var names []asn1.RawValue
	for _, u := range uris {
		names = append(names, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(u)})
	}
	for _, d := range tmpl.DNSNames {
		names = append(names, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, Bytes: []byte(d)})
	}
	for _, ip := range tmpl.IPAddresses {
		if v4 := ip.To4(); v4 != nil {
			ip = v4
		}
		names = append(names, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 7, Bytes: ip})
	}
	der, err := asn1.Marshal(names)
	if err != nil {
		return pkix.Extension{}, fmt.Errorf("tlstest: SAN extension: %w", err)
	}
	empty := len(tmpl.RawSubject) == 0 && len(tmpl.Subject.ToRDNSequence()) == 0
	return pkix.Extension{Id: oidSubjectAltName, Critical: empty, Value: der}, nil
}

// Serial returns the leaf's serial number, for CRLs revoking it.
func (l *Leaf) Serial() *big.Int { return l.Cert.SerialNumber }

// PEM returns the leaf certificate alone in PEM.
func (l *Leaf) PEM() []byte { return CertPEM(l.Cert.Raw) }

// TLS returns the leaf as a tls.Certificate whose chain is the leaf and the
// intermediates above it (not the root: peers hold that), as a workload
// sends it.
func (l *Leaf) TLS() tls.Certificate {
	chain := [][]byte{l.Cert.Raw}
	for ca := l.Issuer; ca != nil && ca.Parent != nil; ca = ca.Parent {
		chain = append(chain, ca.Cert.Raw)
	}
	return tls.Certificate{Certificate: chain, PrivateKey: l.Key, Leaf: l.Cert}
}

// ChainPEM returns the leaf, its intermediates and its root, each in PEM,
// in the caclient chain order mtls.ParseChain takes.
func (l *Leaf) ChainPEM() []string {
	out := []string{string(l.PEM())}
	for ca := l.Issuer; ca != nil; ca = ca.Parent {
		out = append(out, string(ca.PEM()))
	}
	return out
}

// Pool returns a pool holding the root of the leaf's chain (the leaf itself
// if self-signed).
func (l *Leaf) Pool() *x509.CertPool {
	if l.Issuer != nil {
		return l.Issuer.Pool()
	}
	p := x509.NewCertPool()
	p.AddCert(l.Cert)
	return p
}

// Workload parses the leaf and its chain as mtls does for a certificate
// fetched for id, failing the test on error.
func (l *Leaf) Workload(t testing.TB, id identity.Identity) *mtls.WorkloadCert {
	t.Helper()
	if l.Issuer == nil {
		t.Fatal("tlstest: a workload certificate needs a CA above the leaf")
	}
	c, err := mtls.ParseChain(l.ChainPEM(), l.Key, id)
	if err != nil {
		t.Fatalf("tlstest: parse chain for %s: %v", id, err)
	}
	return c
}

// ServerConfig returns a TLS 1.3 server configuration presenting cert. A
// non-nil clientCAs requires and verifies a client certificate against it
// (mutual TLS, as HBONE has it).
func ServerConfig(cert tls.Certificate, clientCAs *x509.CertPool, nextProtos ...string) *tls.Config {
	c := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   nextProtos,
	}
	if clientCAs != nil {
		c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, clientCAs
	}
	return c
}

// ClientConfig returns a TLS 1.3 client configuration verifying the server
// against roots under serverName, presenting cert if not nil.
func ClientConfig(cert *tls.Certificate, roots *x509.CertPool, serverName string, nextProtos ...string) *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    roots,
		ServerName: serverName,
		NextProtos: nextProtos,
	}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

// SelfSignedTLS returns TLS 1.3 configurations with ALPN "h2" for a server
// and a client sharing one fresh self-signed certificate for 127.0.0.1,
// each requiring the other's certificate (mutual TLS, as HBONE does).
func SelfSignedTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	l := SelfSigned(t, LeafOptions{Names: []string{"127.0.0.1"}})
	cert := l.TLS()
	return ServerConfig(cert, l.Pool(), "h2"), ClientConfig(&cert, l.Pool(), "127.0.0.1", "h2")
}
