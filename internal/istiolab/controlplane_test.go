//go:build istiolab

package istiolab

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
)

// requireBins returns the directory of the upstream programs make
// test-istio built and named. These tests carry the istiolab build tag:
// make test and CI, which do not build the programs, do not compile them
// (make lint vets them), so they never skip there.
func requireBins(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(BinsEnv)
	if dir == "" {
		t.Fatalf("%s is not set: run the Istio lab through make test-istio (docs/istio-lab.md)", BinsEnv)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// startControlPlane brings up the control plane on a lab node "cp"; it is
// stopped when the test ends, and a failed test logs the end of each
// component's log.
func startControlPlane(t *testing.T) (*ControlPlane, *netnslab.Lab) {
	t.Helper()
	bins := requireBins(t)
	netnslab.RequireRoot(t)
	lab := netnslab.New(t)
	node, err := lab.AddNode("cp")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	start := time.Now()
	cp, err := Start(t.Context(), Config{Bins: bins, Dir: dir, Node: node, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane ready in %v", time.Since(start).Round(time.Second))
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
			for _, path := range logs {
				c := strings.TrimSuffix(filepath.Base(path), ".log")
				p := &process{name: c, logPath: cp.LogPath(c)}
				t.Logf("--- %s log (end) ---\n%s", c, p.logTail(40))
			}
		}
		if err := cp.Close(); err != nil {
			t.Error(err)
		}
	})
	return cp, lab
}

// TestControlPlane brings up etcd, the API server and istiod with ambient
// on, enrols a namespace with kubectl, and checks istiod as a client sees
// it: it distributes its root to the namespace, serves TLS on its xDS port
// under that root, and its CA signs a CSR only for the identity of a
// service-account token it could verify through TokenReview.
func TestControlPlane(t *testing.T) {
	cp, _ := startControlPlane(t)
	ctx := t.Context()

	// The API server reports the release it was built from (stamped by
	// make istio-bins), as clients that check the server's version expect.
	out, err := cp.Kubectl(ctx, "", "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var version struct {
		ServerVersion struct{ GitVersion, Major, Minor string }
	}
	if err := json.Unmarshal(out, &version); err != nil {
		t.Fatalf("kubectl version: %v: %s", err, out)
	}
	want, err := cp.bins.Version("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	if v := version.ServerVersion; v.GitVersion != want || !strings.HasPrefix(want, "v"+v.Major+"."+v.Minor+".") {
		t.Errorf("server version %+v, want %s", v, want)
	}

	const ns = "ambient-demo"
	if _, err := cp.Kubectl(ctx, `apiVersion: v1
kind: Namespace
metadata:
  name: `+ns+`
  labels:
    istio.io/dataplane-mode: ambient
`, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	out, err = cp.Kubectl(ctx, "", "get", "namespace", ns, "-o", `jsonpath={.metadata.labels.istio\.io/dataplane-mode}`)
	if err != nil || string(out) != "ambient" {
		t.Fatalf("namespace label = %q, %v; want ambient", out, err)
	}

	// istiod's namespace controller writes its CA's root into every
	// namespace it watches: the one just made shows it reads the API.
	rootPEM, err := cp.RootCert(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rootPEM) {
		t.Fatalf("istio-ca-root-cert holds no certificate: %q", rootPEM)
	}

	t.Run("xds port serves TLS under the mesh root", func(t *testing.T) {
		raw, err := cp.Node.Dial(ctx, "tcp", cp.IstiodAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: istiodName, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
		defer conn.Close()
		if err := conn.HandshakeContext(ctx); err != nil {
			t.Fatalf("TLS to istiod %s: %v", cp.IstiodAddr(), err)
		}
		if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
			t.Errorf("ALPN = %q, want h2", p)
		}
	})

	// istiod talks to the API server as its service account, with the
	// istio-discovery chart's roles only: every call it made so far (its
	// informers, its CA's TokenReviews, the root it wrote above) was
	// allowed.
	t.Run("istiod runs as its service account", func(t *testing.T) {
		out, err := kubectl(ctx, cp.Node.NS, cp.bins.Kubectl(), filepath.Join(cp.dir("istiod"), "kubeconfig"), cp.dir("home"), "",
			"auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
		if err != nil {
			t.Fatal(err)
		}
		if want := "system:serviceaccount:" + IstioNamespace + ":" + istiodServiceAccount; string(out) != want {
			t.Errorf("istiod's kubeconfig authenticates as %q, want %q", out, want)
		}
		istiodNotRefused(t, cp)
	})

	ztunnelID := identity.New("cluster.local", IstioNamespace, ZtunnelServiceAccount)
	cniID := identity.New("cluster.local", IstioNamespace, "istio-cni")
	podID := identity.New("cluster.local", ns, "default")
	cases := []struct {
		name        string
		sa          string            // whose token is sent
		audience    string            // the token's audience
		ask         identity.Identity // the CSR's SAN
		impersonate identity.Identity // ImpersonatedIdentity, if any
		code        codes.Code        // istiod's answer
		got         identity.Identity // the identity issued, when OK
		logged      string            // a line istiod must log, when refused
	}{
		{name: "own identity with an istio-ca token", sa: ZtunnelServiceAccount, audience: "istio-ca",
			ask: ztunnelID, code: codes.OK, got: ztunnelID},
		{name: "token for another audience", sa: ZtunnelServiceAccount, audience: "not-istio",
			ask: ztunnelID, code: codes.Unauthenticated, logged: `token audiences ["not-istio"] is invalid`},
		// istiod signs for the identity the token proves, whatever the CSR
		// asks.
		{name: "CSR naming another service account", sa: "istio-cni", audience: "istio-ca",
			ask: ztunnelID, code: codes.OK, got: cniID},
		// Only CA_TRUSTED_NODE_ACCOUNTS may impersonate, and only for pods
		// on the node of the pod its token is bound to: this token names no
		// pod, so the node authorizer looks for none (without the setting
		// istiod would log that no node authorizer is configured).
		{name: "node account impersonating without a pod-bound token", sa: ZtunnelServiceAccount, audience: "istio-ca",
			ask: podID, impersonate: podID, code: codes.Unauthenticated,
			logged: "impersonation failed for identity " + podID.String() + ", error: pod istio-system/ not found"},
		{name: "other account impersonating", sa: "istio-cni", audience: "istio-ca",
			ask: podID, impersonate: podID, code: codes.Unauthenticated, logged: "is not allowed to impersonate"},
	}
	logRSS(t, cp)
	for _, tc := range cases {
		t.Run("CSR: "+tc.name, func(t *testing.T) {
			token, err := cp.ServiceAccountToken(ctx, IstioNamespace, tc.sa, []string{tc.audience}, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			ca, err := caclient.NewIstioCA(caclient.IstioCAConfig{
				Address:     "https://" + cp.IstiodAddr().String(),
				RootCA:      string(rootPEM),
				AltHostname: istiodName,
				Token:       token,
				ClusterID:   "Kubernetes",
				DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
					return cp.Node.Dial(ctx, "tcp", addr)
				})},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer ca.Close()
			chain, err := ca.Sign(ctx, newCSR(t, tc.ask), time.Hour, tc.impersonate)
			if code := status.Code(err); code != tc.code {
				t.Fatalf("CSR for %s: %v; want %v", tc.ask, err, tc.code)
			}
			if tc.code != codes.OK {
				waitUntil(t, 10*time.Second, func() error {
					line, err := logLine(cp.LogPath("istiod"), tc.logged)
					if err == nil {
						t.Logf("istiod: %s", line)
					}
					return err
				})
				return
			}
			leaf := parseLeaf(t, chain[0])
			if len(leaf.URIs) != 1 || leaf.URIs[0].String() != tc.got.String() {
				t.Errorf("issued certificate names %v, want %s", leaf.URIs, tc.got)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Errorf("issued certificate does not chain to istio-ca-root-cert: %v", err)
			}
		})
	}
	istiodNotRefused(t, cp)
}

// istiodNotRefused fails the test if istiod's log shows a call the API
// server refused it (its roles are the chart's: a missing right shows as a
// "forbidden" error of its informers or writes).
func istiodNotRefused(t *testing.T, cp *ControlPlane) {
	t.Helper()
	if line, err := logLine(cp.LogPath("istiod"), "forbidden"); err == nil {
		t.Errorf("istiod was refused a call: %s", line)
	}
}

// logRSS logs each component's resident memory: figures for
// docs/istio-lab.md, not a check.
func logRSS(t *testing.T, cp *ControlPlane) {
	t.Helper()
	for _, p := range cp.procs {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			if rss, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				t.Logf("%s: RSS %s", p.name, strings.TrimSpace(rss))
			}
		}
	}
}

// logLine returns the first line of the log at path that contains part.
func logLine(path, part string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(data)) {
		if strings.Contains(line, part) {
			return strings.TrimSpace(line), nil
		}
	}
	return "", fmt.Errorf("%s has no line with %q", filepath.Base(path), part)
}

// newCSR returns a PEM CSR for id in the form ztunnel sends (no subject,
// the SPIFFE ID as the one URI SAN).
func newCSR(t *testing.T, id identity.Identity) []byte {
	t.Helper()
	u, err := url.Parse(id.String())
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// parseLeaf parses the first certificate of a PEM chain.
func parseLeaf(t *testing.T, chainPEM string) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode([]byte(chainPEM))
	if block == nil {
		t.Fatalf("not PEM: %q", chainPEM)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// waitUntil polls check until it returns nil, failing the test after
// timeout with the last error.
func waitUntil(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", timeout, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-tick.C:
		}
	}
}
