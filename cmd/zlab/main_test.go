package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func zlab(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout+stderr
	}{
		{nil, 2, "Usage:"},
		{[]string{"help"}, 0, "Examples:"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"up", "--nodes", "0"}, 2, "--nodes must be 1..250"},
		{[]string{"up", "--capture-dns"}, 2, "--capture-dns needs --capture"},
		{[]string{"up", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"up", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"exec", "pod0-0", "ls"}, 2, "want <pod-or-node> -- <command>"},
		{[]string{"exec", "--state-dir", "/nonexistent", "pod0-0", "--", "ls"}, 1, "no lab zl-demo"},
		{[]string{"show", "--prefix", "zl-none", "--state-dir", "/nonexistent"}, 1, "run `zlab up --prefix zl-none`"},
		{[]string{"istio"}, 2, "istio: want a subcommand"},
		{[]string{"istio", "frobnicate"}, 2, `istio: unknown command "frobnicate"`},
		{[]string{"istio", "up", "--nodes", "0"}, 2, "--nodes must be 1..20"},
		{[]string{"istio", "exec", "server", "--", "ls"}, 2, "want NAMESPACE/POD -- CMD"},
		{[]string{"istio", "kubectl", "--state-dir", "/nonexistent", "get", "pods"}, 1, "no Istio lab zl-demo"},
		{[]string{"istio", "exec", "--state-dir", "/nonexistent", "demo/server", "--", "ls"}, 1, "run zlab istio up --prefix zl-demo"},
	} {
		code, out, errOut := zlab(t, tc.args...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("zlab %q = %d, %q %q; want %d and %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
	}
}

func TestUpExecDown(t *testing.T) {
	netnslab.RequireRoot(t)
	prefix, dir := netnslab.RandomPrefix(), t.TempDir()
	t.Cleanup(func() { netnslab.RemoveLab(prefix) })
	common := []string{"--prefix", prefix, "--state-dir", dir}

	code, out, errOut := zlab(t, append([]string{"up", "--nodes", "2", "--pods", "1", "--capture", "--json"}, common...)...)
	if code != 0 {
		t.Fatalf("up: %d %s %s", code, out, errOut)
	}
	topo, err := netnslab.ParseTopology([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Pods()) != 2 || !topo.Pods()[0].Captured || topo.Pods()[1].IP.String() != "10.244.1.2" {
		t.Fatalf("up printed %s", out)
	}
	if code, _, errOut := zlab(t, append([]string{"up"}, common...)...); code != 1 || !strings.Contains(errOut, "already up") {
		t.Errorf("second up: %d %s", code, errOut)
	}

	code, out, errOut = zlab(t, append([]string{"show"}, common...)...)
	if code != 0 || !strings.Contains(out, "pod1-0") || !strings.Contains(out, "in-pod") {
		t.Errorf("show: %d %s %s", code, out, errOut)
	}

	code, out, errOut = zlab(t, append(append([]string{"exec"}, common...), "pod1-0", "--", "ip", "-4", "-o", "addr", "show", "dev", "eth0")...)
	if code != 0 || !strings.Contains(out, "10.244.1.2/24") {
		t.Errorf("exec: %d %q %q", code, out, errOut)
	}
	// The command's exit status comes through.
	if code, _, _ := zlab(t, append(append([]string{"exec"}, common...), "node0", "--", "sh", "-c", "exit 7")...); code != 7 {
		t.Errorf("exec exit status = %d, want 7", code)
	}
	if code, _, errOut := zlab(t, append(append([]string{"exec"}, common...), "nobody", "--", "true")...); code != 1 || !strings.Contains(errOut, `no pod or node "nobody"`) {
		t.Errorf("exec unknown: %d %s", code, errOut)
	}

	code, out, errOut = zlab(t, append([]string{"down"}, common...)...)
	if code != 0 || !strings.Contains(out, "removed 5 namespaces") {
		t.Errorf("down: %d %s %s", code, out, errOut)
	}
	if _, err := os.Stat(dir + "/" + prefix + ".json"); !os.IsNotExist(err) {
		t.Errorf("state file left: %v", err)
	}
	if code, out, _ := zlab(t, append([]string{"down"}, common...)...); code != 0 || !strings.Contains(out, "removed 0 namespaces") {
		t.Errorf("second down: %d %s", code, out)
	}
}
