//go:build istiolab

package istiolab

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// TestCNIPodToPod runs istio-cni's node agent on two nodes as the chart
// does, in each capture mode it has (iptables, its default, and native
// nftables), the daemon on each node taking its pods over ZDS from it, and
// pods started by the lab's runtime through istio-cni's plugin in a
// namespace labelled ambient: a server on the first node, a client beside
// it and one on the other node. istio-cni writes each pod's capture rules
// and hands its netns to the node's daemon; istiod, seeing the pods
// enrolled, serves them as HBONE workloads; each client's call reaches the
// server through the daemons' outbound and inbound HBONE paths (the
// server's daemon logs both identities); an AuthorizationPolicy applied
// with kubectl denies the calls and, deleted, allows them again.
func TestCNIPodToPod(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string // the node agent's, over the chart's
		// table is what the pod's rules hold once istio-cni captured it:
		// a command in the pod and a part of its output.
		rules []string
		want  string
	}{
		{name: "iptables", rules: []string{"iptables-save", "-t", "nat"}, want: "-j ISTIO_PRERT"},
		{name: "nftables", env: []string{"NATIVE_NFTABLES=true"}, rules: []string{"nft", "list", "tables"}, want: "istio-ambient-nat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			netnslab.RequireTool(t, tc.rules[0], map[string]string{"iptables-save": "iptables", "nft": "nftables"}[tc.rules[0]])
			cp, lab := startControlPlane(t)
			ctx := t.Context()
			bin := ztunnelBinary(t)
			cnis := make([]*CNI, 2)
			ztunnels := make([]*Ztunnel, 2)
			for i := range cnis {
				cnis[i], ztunnels[i] = startMeshNode(t, cp, lab, fmt.Sprintf("node%d", i+1), bin, tc.env)
			}
			if _, err := cp.Kubectl(ctx, demoNamespaceYAML, "apply", "-f", "-"); err != nil {
				t.Fatal(err)
			}
			server, _, err := cnis[0].RunPod(ctx, PodSpec{Namespace: "demo", Name: "server", ServiceAccount: "server",
				Labels: map[string]string{"app": "server"}})
			if err != nil {
				t.Fatal(err)
			}
			var clients []*netnslab.Pod
			for i, name := range []string{"client-near", "client-far"} {
				c, _, err := cnis[i].RunPod(ctx, PodSpec{Namespace: "demo", Name: name, ServiceAccount: "client",
					Labels: map[string]string{"app": "client"}})
				if err != nil {
					t.Fatal(err)
				}
				clients = append(clients, c)
			}
			// istio-cni marks each pod it enrolled (its annotation), which
			// istiod reads to serve the pod as an HBONE workload.
			for _, name := range []string{"server", "client-near", "client-far"} {
				out, err := cp.Kubectl(ctx, "", "get", "pod", name, "-n", "demo", "-o",
					`jsonpath={.metadata.annotations.ambient\.istio\.io/redirection}`)
				if err != nil || strings.TrimSpace(string(out)) != "enabled" {
					t.Fatalf("pod demo/%s: ambient.istio.io/redirection=%q (%v), want enabled", name, out, err)
				}
			}
			// istio-cni's rules, not the lab's, capture the pod's traffic.
			rules, err := server.Command(ctx, tc.rules[0], tc.rules[1:]...).Output()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(rules, []byte(tc.want)) {
				t.Fatalf("server pod's %s holds no %q:\n%s", strings.Join(tc.rules, " "), tc.want, rules)
			}
			echo := startEcho(t, server, 8080)
			dst := netip.AddrPortFrom(server.IP, 8080)
			serverLog := ztunnels[0].Log

			for _, c := range clients {
				hbone := []string{"connection complete", `direction="inbound"`, "src.addr=" + c.IP.String() + ":",
					`src.identity="spiffe://cluster.local/ns/demo/sa/client"`, `dst.identity="spiffe://cluster.local/ns/demo/sa/server"`}
				waitUntil(t, 2*time.Minute, func() error {
					if err := call(ctx, c, dst); err != nil {
						return fmt.Errorf("%s: %w", c.Name, err)
					}
					if logLineWith(serverLog(), hbone...) == "" {
						return fmt.Errorf("%s: the call succeeded, but not through HBONE yet (no inbound access log line from it with both identities)", c.Name)
					}
					return nil
				})
				t.Logf("%s through HBONE: %s", c.Name, logLineWith(serverLog(), hbone...))
			}
			if echo.count() == 0 {
				t.Fatal("the server saw no connection")
			}

			if _, err := cp.Kubectl(ctx, denyClientYAML, "apply", "-f", "-"); err != nil {
				t.Fatal(err)
			}
			for _, c := range clients {
				denied := []string{"connection complete", `direction="inbound"`, "src.addr=" + c.IP.String() + ":",
					`error="connection closed due to policy rejection: explicitly denied by: demo/deny-client"`}
				waitUntil(t, time.Minute, func() error {
					if err := call(ctx, c, dst); err == nil {
						return fmt.Errorf("%s: the call still succeeds under the DENY policy", c.Name)
					}
					if logLineWith(serverLog(), denied...) == "" {
						return fmt.Errorf("%s: the call failed, but the server's daemon logged no policy rejection", c.Name)
					}
					return nil
				})
			}

			if _, err := cp.Kubectl(ctx, "", "delete", "authorizationpolicy", "deny-client", "-n", "demo"); err != nil {
				t.Fatal(err)
			}
			for _, c := range clients {
				waitUntil(t, time.Minute, func() error { return call(ctx, c, dst) })
			}
		})
	}
}

// startMeshNode adds a node, registers it, and starts istio-cni's agent
// (env over the chart's) and the daemon on it, the daemon taking its pods
// from the agent over ZDS; both stop when the test ends.
func startMeshNode(t *testing.T, cp *ControlPlane, lab *netnslab.Lab, name, bin string, env []string) (*CNI, *Ztunnel) {
	t.Helper()
	ctx := t.Context()
	node, err := lab.AddNode(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.RegisterNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cni, err := cp.StartCNI(ctx, CNIOptions{Node: node, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("istio-cni on %s ready in %v", name, time.Since(start).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if err := cni.Stop(); err != nil {
			t.Error(err)
		}
	})
	zpod, err := node.AddPod("ztunnel-" + name)
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
	return cni, z
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
	return startEchoAt(t, pod, fmt.Sprintf("0.0.0.0:%d", port))
}

// startEchoAt is startEcho on one address of the pod (host:port).
func startEchoAt(t *testing.T, pod *netnslab.Pod, addr string) *echoServer {
	t.Helper()
	ln, err := pod.Listen("tcp", addr)
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

// TestCNIRestart restarts istio-cni's node agent under established pods,
// as a DaemonSet rollout does: the agent leaves the pods' rules in place on
// SIGTERM (its DaemonSet still exists), the daemon keeps serving them while
// no agent runs, and the new agent finds them again through the node's /proc
// (each pod's process, in a cgroup named after the pod's UID, in the pod's
// network namespace) and hands them to the daemon in its snapshot, so calls
// keep going through HBONE; a pod started after the restart joins too.
func TestCNIRestart(t *testing.T) {
	cp, lab := startControlPlane(t)
	ctx := t.Context()
	// Each phase's time, for the figures (docs/istio-lab.md).
	phase := time.Now()
	logPhase := func(what string) {
		t.Logf("%s in %v", what, time.Since(phase).Round(100*time.Millisecond))
		phase = time.Now()
	}
	bin := ztunnelBinary(t)
	node, err := lab.AddNode("node1")
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.RegisterNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	first, err := cp.StartCNI(ctx, CNIOptions{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	zpod, err := node.AddPod("ztunnel-node1")
	if err != nil {
		t.Fatal(err)
	}
	z, err := cp.StartZtunnel(ctx, ZtunnelOptions{Binary: bin, Pod: zpod, InpodUDS: first.ZDSPath})
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
	server, _, err := first.RunPod(ctx, PodSpec{Namespace: "demo", Name: "server", ServiceAccount: "server"})
	if err != nil {
		t.Fatal(err)
	}
	client, _, err := first.RunPod(ctx, PodSpec{Namespace: "demo", Name: "client", ServiceAccount: "client"})
	if err != nil {
		t.Fatal(err)
	}
	startEcho(t, server, 8080)
	dst := netip.AddrPortFrom(server.IP, 8080)
	// throughHBONE makes a call from c and waits for the server's daemon
	// to log one more inbound HBONE connection from it than before (the
	// line comes when the connection is complete, after the call returns).
	throughHBONE := func(c *netnslab.Pod) {
		t.Helper()
		parts := []string{"connection complete", `direction="inbound"`, "src.addr=" + c.IP.String() + ":",
			`dst.identity="spiffe://cluster.local/ns/demo/sa/server"`}
		waitUntil(t, 2*time.Minute, func() error {
			before := logLinesWith(z.Log(), parts...)
			if err := call(ctx, c, dst); err != nil {
				return fmt.Errorf("%s: %w", c.Name, err)
			}
			if nettest.Until(5*time.Second, func() bool { return logLinesWith(z.Log(), parts...) > before }) {
				return nil
			}
			return fmt.Errorf("%s: the call succeeded, but the server's daemon logged no inbound HBONE connection from it", c.Name)
		})
	}
	throughHBONE(client)
	logPhase("the agent, the daemon, two pods and the first call through HBONE")

	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	logPhase("the agent stopped")
	if data, err := os.ReadFile(first.LogPath()); err != nil || !strings.Contains(string(data), "leaving plugin in place") {
		t.Fatalf("the agent did not see an upgrade on SIGTERM (%v):\n%s", err, data)
	}
	throughHBONE(client) // no agent: the daemon keeps its pods
	logPhase("a call with no agent")

	second, err := cp.StartCNI(ctx, CNIOptions{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	logPhase("the agent restarted")
	t.Cleanup(func() {
		if err := second.Stop(); err != nil {
			t.Error(err)
		}
	})
	// The daemon reconnects to the new agent and takes its snapshot; a pod
	// the snapshot lacks would be removed from the daemon.
	waitUntil(t, time.Minute, func() error {
		if n := logLinesWith(z.Log(), "received snapshot"); n < 2 {
			return fmt.Errorf("the daemon took %d snapshots, want 2", n)
		}
		return nil
	})
	logPhase("the daemon took the new agent's snapshot")
	// The agent found each pod's netns (it would send "keep" for a pod it
	// knows of but could not find, and could not reconcile its rules).
	for _, removed := range []string{"pod delete request", "pod not in the snapshot", "pod keep received"} {
		if line := logLineWith(z.Log(), removed); line != "" {
			t.Fatalf("the daemon was not handed its pods again after the agent's restart: %s", line)
		}
	}
	if data, err := os.ReadFile(second.LogPath()); err != nil || strings.Contains(string(data), "can't find netns for pod") {
		t.Fatalf("the restarted agent did not find the pods' netns (%v): %s", err, logLineWith(string(data), "can't find netns"))
	}
	late, _, err := second.RunPod(ctx, PodSpec{Namespace: "demo", Name: "late", ServiceAccount: "client"})
	if err != nil {
		t.Fatal(err)
	}
	throughHBONE(late)
	throughHBONE(client)
	logPhase("a new pod and calls after the restart")
	for _, removed := range []string{"pod delete request", "pod not in the snapshot"} {
		if line := logLineWith(z.Log(), removed); line != "" {
			t.Fatalf("the daemon removed a pod after the agent's restart: %s", line)
		}
	}
}

// logLinesWith counts the lines of log holding every part.
func logLinesWith(log string, parts ...string) int {
	n := 0
	for line := range strings.Lines(log) {
		if logLineWith(line, parts...) != "" {
			n++
		}
	}
	return n
}
