// Package catest is a test kit: a real gRPC Istio CA
// (istio.v1.auth.IstioCertificateService over TLS on a loopback port) that
// signs with a caclient.BuiltinCA, checks the bearer token when told to,
// records every request, and can be made to fail, to issue the wrong
// identity, or to sign through a fresh intermediate CA (a rotation of the
// CA's intermediate, as istiod's plugged-in CA goes through).
//
// Imports (of ours): api/caapi, identity, mtls/caclient, mtls/tlstest (the
// intermediate) and xdsclient/xdstest. Imported by: tests (of mtls/caclient, mtls and the daemon). Production code
// must not import it.
package catest

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel/api/caapi"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// Options configures a Server. The zero value signs for cluster.local with a
// fresh CA and accepts calls without a token.
type Options struct {
	// CA signs the certificates; nil creates one for TrustDomain.
	CA *caclient.BuiltinCA
	// TrustDomain of a created CA; empty means cluster.local.
	TrustDomain string
	// Token, when set, must arrive as "authorization: Bearer <Token>";
	// other calls fail with Unauthenticated.
	Token string
	// ServerNames are the names in the server's TLS certificate; empty means
	// xdstest.DefaultServerNames.
	ServerNames []string
	// Listener, when set, is served instead of a new loopback listener. The
	// server owns it.
	Listener net.Listener
}

// Request is one CreateCertificate call the server received.
type Request struct {
	// CSRIdentity is the identity the CSR asks for (zero if unparsable).
	CSRIdentity identity.Identity
	// Impersonated is the ImpersonatedIdentity metadata value, if any.
	Impersonated string
	// TTL is the requested validity.
	TTL time.Duration
	// Metadata holds the call's headers.
	Metadata metadata.MD
}

// Server is a fake Istio CA.
type Server struct {
	ca    *caclient.BuiltinCA
	tls   *xdstest.TLS
	token string
	addr  string
	gs    *grpc.Server
	wg    sync.WaitGroup

	mu sync.Mutex // guards the following fields
	// failWith, when set, is returned by every call.
	failWith error
	// issueAs, when set, is the identity put in leaves instead of the CSR's.
	issueAs identity.Identity
	// inter, when set, signs the leaves; chains are then
	// [leaf, intermediate, root].
	inter    *caclient.BuiltinCA
	requests []Request
}

// NewServer starts a CA server and stops it when the test ends.
func NewServer(t testing.TB, opts Options) *Server {
	t.Helper()
	ca := opts.CA
	if ca == nil {
		var err error
		if ca, err = caclient.NewBuiltinCA(opts.TrustDomain); err != nil {
			t.Fatal(err)
		}
	}
	s := &Server{ca: ca, tls: xdstest.NewTLS(t, opts.ServerNames...), token: opts.Token}
	lis := opts.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	s.addr = lis.Addr().String()
	s.gs = grpc.NewServer(grpc.Creds(credentials.NewTLS(s.tls.ServerConfig)), grpc.WaitForHandlers(true))
	caapi.RegisterIstioCertificateServiceServer(s.gs, s)
	s.wg.Go(func() { _ = s.gs.Serve(lis) })
	t.Cleanup(s.Stop)
	return s
}

// Address returns "https://127.0.0.1:<port>".
func (s *Server) Address() string { return "https://" + s.addr }

// TLS returns the server's TLS material (RootFile for CA_ROOT_CA).
func (s *Server) TLS() *xdstest.TLS { return s.tls }

// CA returns the signing CA (RootPEM is the mesh's trust anchor).
func (s *Server) CA() *caclient.BuiltinCA { return s.ca }

// Stop stops the server. It is idempotent.
func (s *Server) Stop() {
	s.gs.Stop()
	s.wg.Wait()
}

// SetFailing makes every call fail with err (a gRPC status error, or
// Unavailable for other errors) until called with nil: a CA outage.
func (s *Server) SetFailing(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failWith = err
}

// IssueAs makes the server put id in every leaf instead of the identity
// asked for (the zero identity restores normal issuance).
func (s *Server) IssueAs(id identity.Identity) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.issueAs = id
}

// UseIntermediate creates a new intermediate CA under the root, valid for
// an hour, and signs every later leaf with it: the chains the server
// returns become [leaf, intermediate, root]. Each call rotates to a new
// intermediate; the root, the mesh's trust anchor, stays. It returns the
// new intermediate's certificate.
func (s *Server) UseIntermediate(t testing.TB) *x509.Certificate {
	t.Helper()
	now := time.Now()
	tds := s.ca.TrustDomains()
	inter := tlstest.FromBuiltin(t, s.ca).Intermediate(t, tlstest.CAOptions{
		CommonName:   "catest intermediate",
		Organization: tds,
		TrustDomains: tds[:1],
		KeyUsage:     x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
	})
	b := inter.Builtin(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inter = b
	return inter.Cert
}

// Requests returns the calls received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// CreateCertificate implements the service.
func (s *Server) CreateCertificate(ctx context.Context, req *caapi.IstioCertificateRequest) (*caapi.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	rec := Request{TTL: time.Duration(req.GetValidityDuration()) * time.Second, Metadata: md}
	if v := req.GetMetadata().GetFields()[caclient.ImpersonatedIdentityKey]; v != nil {
		rec.Impersonated = v.GetStringValue()
	}
	csr := parseCSR(req.GetCsr())
	if csr != nil && len(csr.URIs) == 1 {
		rec.CSRIdentity, _ = identity.Parse(csr.URIs[0].String())
	}
	s.mu.Lock()
	s.requests = append(s.requests, rec)
	failWith, issueAs, inter := s.failWith, s.issueAs, s.inter
	s.mu.Unlock()

	if failWith != nil {
		if _, ok := status.FromError(failWith); ok {
			return nil, failWith
		}
		return nil, status.Error(codes.Unavailable, failWith.Error())
	}
	if s.token != "" {
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+s.token {
			return nil, status.Error(codes.Unauthenticated, "authentication failure")
		}
	}
	var imp identity.Identity
	if rec.Impersonated != "" {
		var err error
		if imp, err = identity.Parse(rec.Impersonated); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	if !issueAs.IsZero() {
		if csr == nil {
			return nil, status.Error(codes.InvalidArgument, "bad csr")
		}
		leaf, err := s.signAs(csr, issueAs, rec.TTL)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &caapi.IstioCertificateResponse{CertChain: []string{leaf, string(s.ca.RootPEM())}}, nil
	}
	signer := s.ca
	if inter != nil {
		signer = inter
	}
	chain, err := signer.Sign(ctx, []byte(req.GetCsr()), rec.TTL, imp)
	if err != nil {
		if errors.Is(err, caclient.ErrCSRRejected) {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	if inter != nil {
		// The intermediate's Sign gives [leaf, intermediate]; Istio's CA
		// ends the chain with the root.
		chain = append(chain, string(s.ca.RootPEM()))
	}
	return &caapi.IstioCertificateResponse{CertChain: chain}, nil
}

func parseCSR(p string) *x509.CertificateRequest {
	block, _ := pem.Decode([]byte(p))
	if block == nil {
		return nil
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil
	}
	return csr
}

// signAs issues a leaf for csr's key naming id, as a misbehaving CA would.
func (s *Server) signAs(csr *x509.CertificateRequest, id identity.Identity, ttl time.Duration) (string, error) {
	root, err := parseCert(s.ca.RootPEM())
	if err != nil {
		return "", err
	}
	key, err := parseKey(s.ca.KeyPEM())
	if err != nil {
		return "", err
	}
	u, err := url.Parse(id.String())
	if err != nil {
		return "", err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(max(ttl, time.Hour)),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root, csr.PublicKey, key)
	if err != nil {
		return "", err
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), nil
}

func parseCert(p []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(p)
	if block == nil {
		return nil, errors.New("catest: no certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func parseKey(p []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(p)
	if block == nil {
		return nil, errors.New("catest: no key")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("catest: key cannot sign")
	}
	return s, nil
}
