//go:build istiolab

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/istiolab"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// TestIstioDemo runs make demo-istio's command through the zlab binary:
// it must pass, show the call through HBONE with both identities in the
// server's daemon's log line, the policy's refusal with the daemon's reason,
// and leave no namespace behind.
func TestIstioDemo(t *testing.T) {
	bins := os.Getenv(istiolab.BinsEnv)
	daemon := os.Getenv("ZTUNNEL_BIN")
	if bins == "" || daemon == "" {
		t.Fatalf("%s and ZTUNNEL_BIN are not set: run it through make test-istio (docs/istio-lab.md)", istiolab.BinsEnv)
	}
	netnslab.RequireRoot(t)
	bin := filepath.Join(t.TempDir(), "zlab")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building zlab: %v\n%s", err, out)
	}
	prefix := netnslab.RandomPrefix()
	out, err := exec.Command(bin, "istio", "demo", "--prefix", prefix, "--state-dir", t.TempDir(),
		"--bins", bins, "--ztunnel", daemon, "--examples", "../../examples/istio-demo").CombinedOutput()
	t.Logf("zlab istio demo:\n%s", out)
	if left, _ := netnslab.RemoveLab(prefix); len(left) > 0 {
		t.Errorf("the demo left namespaces %v", left)
	}
	if err != nil {
		t.Fatalf("zlab istio demo: %v", err)
	}
	for _, want := range []string{
		"$ zlab istio kubectl --prefix " + prefix,
		`src.identity="spiffe://cluster.local/ns/demo/sa/client"`,
		`dst.identity="spiffe://cluster.local/ns/demo/sa/server"`,
		"explicitly denied by: demo/deny-client",
		"answer: hello from demo/server",
		"Istio lab " + prefix + ": down",
		"==> demo passed",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
}
