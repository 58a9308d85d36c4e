//go:build istiolab

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/istiolab"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// TestIstioHandle drives the Istio lab as an operator does, through the
// zlab binary: up with two nodes, a namespace, service accounts, two plain
// Pods and a Service applied with kubectl (the pods bound to the nodes and
// started through istio-cni by the lab's runtime), calls from one pod to the
// other with exec (curl, to the pod's IP and to the Service's VIP) that the
// server's daemon logs as HBONE (logs), an AuthorizationPolicy applied with
// kubectl that refuses them, and down, which
// leaves no namespace behind. Run by make test-istio (build tag istiolab),
// which builds the upstream programs and bin/ztunnel.
func TestIstioHandle(t *testing.T) {
	bins := os.Getenv(istiolab.BinsEnv)
	daemon := os.Getenv("ZTUNNEL_BIN")
	if bins == "" || daemon == "" {
		t.Fatalf("%s and ZTUNNEL_BIN are not set: run it through make test-istio (docs/istio-lab.md)", istiolab.BinsEnv)
	}
	netnslab.RequireRoot(t)
	netnslab.RequireTool(t, "curl", "curl")
	bin := filepath.Join(t.TempDir(), "zlab")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building zlab: %v\n%s", err, out)
	}
	state := t.TempDir()
	prefix := netnslab.RandomPrefix()
	zl := func(stdin string, args ...string) (string, error) {
		args = append(args[:2:2], append([]string{"--prefix", prefix, "--state-dir", state}, args[2:]...)...)
		cmd := exec.Command(bin, args...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := zl("", "istio", "up", "--nodes", "2", "--bins", bins, "--ztunnel", daemon)
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := zl("", "istio", "logs", "serve")
			t.Logf("supervisor's log:\n%s", log)
		}
		if out, err := zl("", "istio", "down"); err != nil {
			t.Errorf("zlab istio down: %v\n%s", err, out)
		}
		if left, _ := netnslab.RemoveLab(prefix); len(left) > 0 {
			t.Errorf("zlab istio down left namespaces %v", left)
		}
	})
	if err != nil {
		t.Fatalf("zlab istio up: %v\n%s", err, out)
	}
	if kc := strings.TrimSpace(out); !strings.HasSuffix(kc, "kubeconfig") {
		t.Fatalf("zlab istio up printed %q, want the kubeconfig's path", out)
	} else if _, err := os.Stat(kc); err != nil {
		t.Fatal(err)
	}
	if out, err := zl(podsYAML, "istio", "kubectl", "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	// The runtime starts the pods; their network namespaces are in the
	// supervisor's state.
	var st istioState
	waitFor(t, time.Minute, func() bool {
		data, err := os.ReadFile(filepath.Join(state, prefix+"-istio", "state.json"))
		return err == nil && json.Unmarshal(data, &st) == nil && st.Pods["demo/server"] != "" && st.Pods["demo/client"] != ""
	})
	ip, err := zl("", "istio", "kubectl", "get", "pod", "server", "-n", "demo", "-o", "jsonpath={.status.podIP}")
	if err != nil {
		t.Fatalf("%v: %s", err, ip)
	}
	// The server: HTTP inside its pod's network namespace.
	ln, err := netnslab.NS{NetNS: st.Pods["demo/server"]}.Listen("tcp", "0.0.0.0:8080")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }),
		ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	vip, err := zl("", "istio", "kubectl", "get", "service", "server", "-n", "demo", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatalf("%v: %s", err, vip)
	}
	// The pod by its IP, and the Service by its VIP (port 80 to the pod's
	// 8080), which the client's daemon resolves to the pod.
	targets := []string{strings.TrimSpace(ip) + ":8080", strings.TrimSpace(vip) + ":80"}
	curl := func(target string) (string, error) {
		return zl("", "istio", "exec", "demo/client", "--", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
			"--max-time", "5", "http://"+target+"/")
	}
	for _, target := range targets {
		waitFor(t, time.Minute, func() bool {
			out, err := curl(target)
			if err != nil || out != "200" {
				return false
			}
			logs, _ := zl("", "istio", "logs", "ztunnel-node2")
			return strings.Contains(logs, `src.identity="spiffe://cluster.local/ns/demo/sa/client"`) && strings.Contains(logs, `direction="inbound"`)
		})
	}
	if out, err := zl(denyYAML, "istio", "kubectl", "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	for _, target := range targets {
		waitFor(t, time.Minute, func() bool {
			out, err := curl(target)
			logs, _ := zl("", "istio", "logs", "ztunnel-node2")
			return err != nil && out != "200" && strings.Contains(logs, "explicitly denied by: demo/deny-client")
		})
	}
}

// The runtime binds pods to the nodes in turn: the first to node1, the
// second to node2.
const podsYAML = `apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: server, namespace: demo}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: demo, labels: {app: client}}
spec:
  serviceAccountName: client
  containers: [{name: client, image: example.invalid/client}]
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: demo, labels: {app: server}}
spec:
  serviceAccountName: server
  nodeName: node2
  containers: [{name: server, image: example.invalid/server}]
---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: demo}
spec:
  selector: {app: server}
  ports: [{name: http, port: 80, targetPort: 8080}]
`

const denyYAML = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-client, namespace: demo}
spec:
  selector: {matchLabels: {app: server}}
  action: DENY
  rules: [{from: [{source: {principals: ["cluster.local/ns/demo/sa/client"]}}]}]
`

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	if !nettest.Until(timeout, cond) {
		t.Fatalf("not within %v", timeout)
	}
}
