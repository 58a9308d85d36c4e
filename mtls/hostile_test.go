package mtls_test

import (
	"crypto/tls"
	"errors"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// Hostile certificates from our own CA, through real handshakes: what a
// peer whose CA was tricked (or an attacker holding a CA-signed leaf with
// odd SANs) may present. Each case is what ztunnel (webpki and its
// Identity::from_str) decides.

// sendCert is a client config that presents leaf whatever the server asks
// and checks nothing of the server: only the server's verdict is tested.
func sendCert(leaf *tlstest.Leaf) *tls.Config {
	cert := leaf.TLS()
	return &tls.Config{
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
		InsecureSkipVerify:   true,
		MinVersion:           tls.VersionTLS13,
		NextProtos:           []string{"h2"},
	}
}

// TestServerHostileClientCerts: the 15008 side (ServerConfig) and the
// identity the proxy then reads (PeerIdentity).
func TestServerHostileClientCerts(t *testing.T) {
	builtin := tlstest.NewCA(t, "cluster.local")
	ca := tlstest.FromBuiltin(t, builtin)
	srv := mtls.ServerConfig(static(tlstest.Cert(t, builtin, serverID)))
	good := clientID.String()

	tests := []struct {
		name string
		leaf tlstest.LeafOptions
		// wantErr is the server's error; nil means the handshake succeeds
		// and the server reads wantID.
		wantErr error
		wantID  identity.Identity
	}{
		{
			name:    "CA certificate as the client's",
			leaf:    tlstest.LeafOptions{URIs: []string{good}, CA: true},
			wantErr: mtls.ErrCAAsEndEntity,
		},
		{
			name:    "upper-case scheme is no identity",
			leaf:    tlstest.LeafOptions{RawURIs: []string{"SPIFFE://cluster.local/ns/ns-b/sa/client"}},
			wantErr: mtls.ErrTrustDomain,
		},
		{
			name:    "mixed-case scheme is no identity",
			leaf:    tlstest.LeafOptions{RawURIs: []string{"Spiffe://cluster.local/ns/ns-b/sa/client"}},
			wantErr: mtls.ErrTrustDomain,
		},
		{
			name:   "upper-case first URI is skipped",
			leaf:   tlstest.LeafOptions{RawURIs: []string{"SPIFFE://cluster.local/ns/admin/sa/root", good}},
			wantID: clientID,
		},
		{
			name:   "first URI with an empty namespace decides",
			leaf:   tlstest.LeafOptions{URIs: []string{"spiffe://cluster.local/ns//sa/client", good}},
			wantID: identity.Identity{TrustDomain: "cluster.local", ServiceAccount: "client"},
		},
		{
			name:   "first URI with empty segments decides",
			leaf:   tlstest.LeafOptions{URIs: []string{"spiffe://cluster.local/ns//sa/", good}},
			wantID: identity.Identity{TrustDomain: "cluster.local"},
		},
		{
			name:   "first URI of another trust domain decides",
			leaf:   tlstest.LeafOptions{URIs: []string{"spiffe://other.td/ns/ns-b/sa/client", good}},
			wantID: identity.New("other.td", "ns-b", "client"),
		},
		{
			name:   "non-SPIFFE first URI is skipped",
			leaf:   tlstest.LeafOptions{URIs: []string{"https://example.com/ns/a/sa/b", good}},
			wantID: clientID,
		},
		{
			name:   "malformed SPIFFE first URI is skipped",
			leaf:   tlstest.LeafOptions{URIs: []string{"spiffe://cluster.local/ns/a/sa/b/c", good}},
			wantID: clientID,
		},
		{
			name:    "only an empty trust domain",
			leaf:    tlstest.LeafOptions{URIs: []string{"spiffe:///ns/ns-b/sa/client"}},
			wantErr: mtls.ErrTrustDomain,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := handshake(t, srv, sendCert(ca.Leaf(t, tc.leaf)))
			if tc.wantErr != nil {
				if !errors.Is(r.srvErr, tc.wantErr) {
					t.Fatalf("server error %v, want %v", r.srvErr, tc.wantErr)
				}
				if r.cliErr == nil {
					t.Fatal("client did not see the refusal")
				}
				return
			}
			if r.srvErr != nil || r.cliErr != nil {
				t.Fatalf("handshake failed: server %v, client %v", r.srvErr, r.cliErr)
			}
			got, err := mtls.PeerIdentity(r.srv)
			if err != nil || got != tc.wantID {
				t.Fatalf("PeerIdentity = %+v, %v; want %+v", got, err, tc.wantID)
			}
		})
	}
}

// TestClientHostileServerCerts: our outbound side (ClientConfig) against a
// server presenting a hostile leaf from the mesh's CA.
func TestClientHostileServerCerts(t *testing.T) {
	builtin := tlstest.NewCA(t, "cluster.local")
	ca := tlstest.FromBuiltin(t, builtin)
	cli := tlstest.Cert(t, builtin, clientID)
	want := serverID.String()

	tests := []struct {
		name     string
		leaf     tlstest.LeafOptions
		expected []string
		wantErr  error // nil: accepted
	}{
		{
			name:     "CA certificate as the server's",
			leaf:     tlstest.LeafOptions{URIs: []string{want}, CA: true},
			expected: []string{want},
			wantErr:  mtls.ErrCAAsEndEntity,
		},
		{
			name:     "upper-case scheme",
			leaf:     tlstest.LeafOptions{RawURIs: []string{"SPIFFE://cluster.local/ns/ns-a/sa/server"}},
			expected: []string{want},
			wantErr:  mtls.ErrIdentityMismatch,
		},
		{
			name:     "upper-case expected SAN is no identity",
			leaf:     tlstest.LeafOptions{RawURIs: []string{"SPIFFE://cluster.local/ns/ns-a/sa/server"}},
			expected: []string{"SPIFFE://cluster.local/ns/ns-a/sa/server"},
			wantErr:  mtls.ErrIdentityMismatch,
		},
		{
			name:     "expected identity in a later URI",
			leaf:     tlstest.LeafOptions{URIs: []string{"spiffe://cluster.local/ns//sa/x", "https://example.com/", want}},
			expected: []string{want},
		},
		{
			name:     "empty segments match as written",
			leaf:     tlstest.LeafOptions{URIs: []string{"spiffe://cluster.local/ns//sa/"}},
			expected: []string{"spiffe://cluster.local/ns//sa/"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leaf := ca.Leaf(t, tc.leaf)
			srv := &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{leaf.TLS()},
				ClientAuth:   tls.RequireAnyClientCert,
				NextProtos:   []string{"h2"},
			}
			r := handshake(t, srv, mtls.ClientConfig(cli, tc.expected))
			if tc.wantErr == nil {
				if r.cliErr != nil || r.srvErr != nil {
					t.Fatalf("handshake failed: client %v, server %v", r.cliErr, r.srvErr)
				}
				return
			}
			if !errors.Is(r.cliErr, tc.wantErr) {
				t.Fatalf("client error %v, want %v", r.cliErr, tc.wantErr)
			}
		})
	}
}
