//go:build istiolab

package istiolab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// TestCNIPodToPod runs istio-cni's node agent on a node as the chart does,
// the daemon on the same node taking its pods over ZDS from it, and two
// pods started by the lab's runtime through istio-cni's plugin in a
// namespace labelled ambient. istio-cni writes each pod's capture rules and
// hands its netns to the daemon; istiod, seeing the pods enrolled, serves
// them as HBONE workloads; the client's call to the server goes through the
// daemon's outbound and inbound HBONE paths (its access log says so); an
// AuthorizationPolicy applied with kubectl denies the call and, deleted,
// allows it again.
func TestCNIPodToPod(t *testing.T) {
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
	start := time.Now()
	cni, err := cp.StartCNI(ctx, CNIOptions{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("istio-cni ready in %v", time.Since(start).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if err := cni.Stop(); err != nil {
			t.Error(err)
		}
	})
	zpod, err := node.AddPod("ztunnel-node1")
	if err != nil {
		t.Fatal(err)
	}
	z, err := cp.StartZtunnel(ctx, ZtunnelOptions{Binary: bin, Pod: zpod, InpodUDS: cni.ZDSPath})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := z.Stop(); err != nil {
			t.Error(err)
		}
	})

	if _, err := cp.Kubectl(ctx, demoNamespaceYAML, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	server, _, err := cni.RunPod(ctx, PodSpec{Namespace: "demo", Name: "server", ServiceAccount: "server",
		Labels: map[string]string{"app": "server"}})
	if err != nil {
		t.Fatal(err)
	}
	client, _, err := cni.RunPod(ctx, PodSpec{Namespace: "demo", Name: "client", ServiceAccount: "client",
		Labels: map[string]string{"app": "client"}})
	if err != nil {
		t.Fatal(err)
	}
	// istio-cni marks each pod it enrolled (its annotation), which istiod
	// reads to serve the pod as an HBONE workload.
	for _, name := range []string{"server", "client"} {
		out, err := cp.Kubectl(ctx, "", "get", "pod", name, "-n", "demo", "-o",
			`jsonpath={.metadata.annotations.ambient\.istio\.io/redirection}`)
		if err != nil || strings.TrimSpace(string(out)) != "enabled" {
			t.Fatalf("pod demo/%s: ambient.istio.io/redirection=%q (%v), want enabled", name, out, err)
		}
	}
	// istio-cni's rules, not the lab's, capture the pod's traffic.
	rules, err := server.Command(ctx, "iptables-save").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(rules, []byte("ISTIO_PRERT")) || !bytes.Contains(rules, []byte("--to-ports 15006")) {
		t.Fatalf("server pod's iptables hold no istio-cni capture rules:\n%s", rules)
	}
	echo := startEcho(t, server, 8080)

	dst := netip.AddrPortFrom(server.IP, 8080)
	hboneLine := []string{"connection complete", `direction="inbound"`,
		`src.identity="spiffe://cluster.local/ns/demo/sa/client"`, `dst.identity="spiffe://cluster.local/ns/demo/sa/server"`}
	waitUntil(t, 2*time.Minute, func() error {
		if err := call(ctx, client, dst); err != nil {
			return err
		}
		if line := logLineWith(z.Log(), hboneLine...); line == "" {
			return errors.New("the call succeeded, but not through HBONE yet (no inbound access log line with both identities)")
		}
		return nil
	})
	t.Logf("through HBONE: %s", logLineWith(z.Log(), hboneLine...))
	if echo.count() == 0 {
		t.Fatal("the server saw no connection")
	}

	if _, err := cp.Kubectl(ctx, denyClientYAML, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	denied := []string{"connection complete", `direction="inbound"`, "policy rejection"}
	waitUntil(t, time.Minute, func() error {
		if err := call(ctx, client, dst); err == nil {
			return errors.New("the call still succeeds under the DENY policy")
		}
		if logLineWith(z.Log(), denied...) == "" {
			return errors.New("the call failed, but the daemon logged no policy rejection")
		}
		return nil
	})
	t.Logf("denied: %s", logLineWith(z.Log(), denied...))

	if _, err := cp.Kubectl(ctx, "", "delete", "authorizationpolicy", "deny-client", "-n", "demo"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, func() error { return call(ctx, client, dst) })
}

// demoNamespaceYAML is the test's namespace, in the mesh by its label, and
// its pods' service accounts (no controller manager makes them).
const demoNamespaceYAML = `apiVersion: v1
kind: Namespace
metadata:
  name: demo
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: server
  namespace: demo
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: client
  namespace: demo
`

// denyClientYAML denies the client's identity at the server.
const denyClientYAML = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: deny-client
  namespace: demo
spec:
  selector:
    matchLabels:
      app: server
  action: DENY
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/demo/sa/client"]
`

// call connects from pod to dst and checks that a line comes back echoed.
func call(ctx context.Context, pod *netnslab.Pod, dst netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pod.Dial(ctx, "tcp", dst.String())
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	msg := []byte("hello through the mesh\n")
	if _, err := conn.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, got); err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// echoServer echoes every connection to a port of a pod.
type echoServer struct {
	mu    sync.Mutex
	conns int
}

func (e *echoServer) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.conns
}

// startEcho listens on port in pod; it stops when the test ends.
func startEcho(t *testing.T, pod *netnslab.Pod, port int) *echoServer {
	t.Helper()
	ln, err := pod.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns++
			e.mu.Unlock()
			wg.Add(1)
			go func(c net.Conn) {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return e
}

// logLineWith returns the first line of log holding every part.
func logLineWith(log string, parts ...string) string {
	for line := range strings.Lines(log) {
		ok := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				ok = false
				break
			}
		}
		if ok {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
