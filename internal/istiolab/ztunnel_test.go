//go:build istiolab

package istiolab

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/inpod/zdstest"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// ztunnelBinary is the daemon the lab runs: ZTUNNEL_BIN (make test-istio
// sets it to bin/ztunnel), else one built for the test.
func ztunnelBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("ZTUNNEL_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "ztunnel")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/ztunnel-go/ztunnel/cmd/ztunnel")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the daemon: %v\n%s", err, out)
	}
	return bin
}

// TestZtunnelWithIstiod runs the daemon in shared mode on a node as the
// ztunnel chart does, against the lab's istiod: it becomes ready only once
// istiod has served it both xDS types over TLS after checking its token,
// and its own certificate comes from istiod's CA. The CNI agent is still the
// fake one (zdstest), with no pod to hand over.
func TestZtunnelWithIstiod(t *testing.T) {
	cp, lab := startControlPlane(t)
	ctx := t.Context()
	bin := ztunnelBinary(t)
	node, err := lab.AddNode("node1")
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.RegisterNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	pod, err := node.AddPod("ztunnel-node1")
	if err != nil {
		t.Fatal(err)
	}
	agent, err := zdstest.Start(zdstest.Config{Path: filepath.Join(t.TempDir(), "ztunnel.sock"), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.Close() })

	z, err := cp.StartZtunnel(ctx, ZtunnelOptions{Binary: bin, Pod: pod, InpodUDS: agent.Path()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := z.Stop(); err != nil {
			t.Error(err)
		}
	})

	root, err := cp.RootCert(ctx, IstioNamespace)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(root)
	// The self-proxy's identity (POD_NAME, POD_NAMESPACE, SERVICE_ACCOUNT
	// set, as the chart sets them) is fetched from istiod's CA once synced.
	want := "spiffe://cluster.local/ns/" + IstioNamespace + "/sa/" + ZtunnelServiceAccount
	waitUntil(t, time.Minute, func() error {
		certs, err := configDumpCerts(ctx, pod)
		if err != nil {
			return err
		}
		for _, c := range certs {
			if c.Identity != want || len(c.CertChain) == 0 {
				continue
			}
			leaf, err := parseDumpCert(c.CertChain[0].PEM)
			if err != nil {
				return err
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				return fmt.Errorf("certificate of %s does not chain to istiod's root: %w", want, err)
			}
			return nil
		}
		return fmt.Errorf("no certificate for %s in /config_dump (have %+v)", want, certs)
	})
}

// dumpCert is the part of a /config_dump certificate entry the test reads.
type dumpCert struct {
	Identity  string `json:"identity"`
	State     string `json:"state"`
	CertChain []struct {
		PEM string `json:"pem"`
	} `json:"certChain"`
}

// configDumpCerts reads the daemon's certificates from its admin server.
func configDumpCerts(ctx context.Context, pod *netnslab.Pod) ([]dumpCert, error) {
	data, err := fetchConfigDump(ctx, pod)
	if err != nil {
		return nil, err
	}
	var dump struct {
		Certificates []dumpCert `json:"certificates"`
	}
	if err := json.Unmarshal(data, &dump); err != nil {
		return nil, fmt.Errorf("config_dump: %w", err)
	}
	return dump.Certificates, nil
}

// parseDumpCert decodes a /config_dump certificate: PEM, base64-encoded.
func parseDumpCert(b64 string) (*x509.Certificate, error) {
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("config_dump certificate is not PEM")
	}
	return x509.ParseCertificate(block.Bytes)
}
