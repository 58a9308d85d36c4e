package caclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ztunnel-go/ztunnel/api/caapi"
	"github.com/ztunnel-go/ztunnel/controlplane"
	"github.com/ztunnel-go/ztunnel/identity"
)

// ErrEmptyResponse means the Istio CA answered without a certificate chain.
var ErrEmptyResponse = errors.New("caclient: istio ca returned no certificate")

// DefaultCallTimeout bounds one CreateCertificate call when
// IstioCAConfig.CallTimeout is zero. The certificate store retries failed
// calls with backoff, so a CA that hangs costs one timeout per attempt.
const DefaultCallTimeout = 30 * time.Second

// ImpersonatedIdentityKey is the request metadata key that names the
// identity a node proxy asks for on behalf of a pod (shared mode).
const ImpersonatedIdentityKey = "ImpersonatedIdentity"

// IstioCAConfig says how to reach the Istio CA (istiod's
// IstioCertificateService).
type IstioCAConfig struct {
	// Address is the CA's URL (CA_ADDRESS), e.g.
	// "https://istiod.istio-system.svc:15012"; https:// is assumed when the
	// scheme is missing. Required.
	Address string
	// RootCA verifies the CA (CA_ROOT_CA): a PEM file path, re-read when it
	// changes, "SYSTEM", or inline PEM. Empty means the system roots.
	RootCA string
	// AltHostname is accepted as the CA's name when the address's host does
	// not match its certificate (ALT_CA_HOSTNAME).
	AltHostname string
	// TokenPath is the JWT file sent as "authorization: Bearer" (AUTH_TOKEN
	// naming a file), read for every call; Token is a static JWT used when
	// TokenPath is empty. With neither, no auth headers are sent.
	TokenPath, Token string
	// ClusterID goes in the clusterid header next to the token.
	ClusterID string
	// Headers are extra gRPC metadata on every call (CA_HEADER_*).
	Headers map[string]string
	// CallTimeout bounds each call; zero means DefaultCallTimeout.
	CallTimeout time.Duration
	// DialOptions are added to the gRPC connection's options.
	DialOptions []grpc.DialOption
	// CurvePreferences restricts the TLS key exchange with the CA
	// (COMPLIANCE_POLICY=pqc); nil is Go's default.
	CurvePreferences []tls.CurveID
}

// IstioCA signs CSRs through the Istio CA's
// istio.v1.auth.IstioCertificateService/CreateCertificate over one gRPC
// connection. It implements Signer and is safe for concurrent use; Close it
// when done.
type IstioCA struct {
	cc      *grpc.ClientConn
	client  caapi.IstioCertificateServiceClient
	timeout time.Duration
}

var _ Signer = (*IstioCA)(nil)

// NewIstioCA returns a signer for the CA cfg describes. It fails on an
// unusable address or inline roots; it does not connect until the first
// Sign. A root file is read at each handshake, so one Kubernetes mounts late
// (or that is bad for a while) fails the Signs until it is fixed, and the
// certificate store's retries with backoff then succeed.
func NewIstioCA(cfg IstioCAConfig) (*IstioCA, error) {
	cc, err := controlplane.Dial(controlplane.Config{
		Address: cfg.Address, RootCA: cfg.RootCA, AltHostname: cfg.AltHostname,
		TokenPath: cfg.TokenPath, Token: cfg.Token, ClusterID: cfg.ClusterID, Headers: cfg.Headers,
		CurvePreferences: cfg.CurvePreferences,
	}, cfg.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("caclient: %w", err)
	}
	timeout := cfg.CallTimeout
	if timeout <= 0 {
		timeout = DefaultCallTimeout
	}
	return &IstioCA{cc: cc, client: caapi.NewIstioCertificateServiceClient(cc), timeout: timeout}, nil
}

// Sign sends csrPEM with the requested validity (whole seconds) and, when
// impersonate is set, the ImpersonatedIdentity metadata, as ztunnel does in
// shared mode. It returns the chain as the CA sent it; Client.Fetch checks
// that the leaf carries the identity asked for.
func (c *IstioCA) Sign(ctx context.Context, csrPEM []byte, ttl time.Duration, impersonate identity.Identity) ([]string, error) {
	req := &caapi.IstioCertificateRequest{Csr: string(csrPEM), ValidityDuration: int64(ttl / time.Second)}
	if !impersonate.IsZero() {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			ImpersonatedIdentityKey: structpb.NewStringValue(impersonate.String()),
		}}
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.CreateCertificate(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("caclient: istio ca: %w", err)
	}
	if len(resp.GetCertChain()) == 0 {
		return nil, ErrEmptyResponse
	}
	return resp.GetCertChain(), nil
}

// Close closes the connection. Signs after Close fail.
func (c *IstioCA) Close() error { return c.cc.Close() }
