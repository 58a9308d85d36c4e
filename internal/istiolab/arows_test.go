//go:build istiolab

package istiolab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// The A-rows of docs/ztunnel-scenarios.md (Istio's own ambient integration
// cases) through real istiod and istio-cni: Istio's objects applied with
// kubectl, their effect checked on calls between pods the lab's runtime
// started through istio-cni's plugin, and on the daemons' access logs.

// arowsLab is the suite's one lab: the control plane, two nodes with
// istio-cni (iptables capture, the default) and the daemon, and the pods.
type arowsLab struct {
	cp       *ControlPlane
	mode     captureMode
	cnis     []*CNI
	ztunnels []*Ztunnel
	// server runs on node1 with an echo on serverPort and otherPort; every
	// client runs on node2, so each call crosses nodes and the server's
	// daemon (node1's) logs what arrived and how.
	server *netnslab.Pod
	// client (sa client) and other (sa other) are in namespace arows,
	// clientB (sa client) in arows-b: all three in the mesh.
	client, other, clientB *netnslab.Pod
	// plain is in namespace outside, which is not in the mesh: a client
	// without mTLS, and the endpoint of the ServiceEntries (echo on
	// serverPort).
	plain *netnslab.Pod
	// optout is in arows but labelled istio.io/dataplane-mode=none;
	// joiner is in namespace joiner, which the suite enrols and unenrols.
	optout, joiner *netnslab.Pod
}

const (
	serverPort = 8080
	otherPort  = 9090
)

// arowsNamespacesYAML: arows and arows-b in the mesh by their label,
// outside and joiner not; the pods' service accounts (no controller manager
// makes them).
const arowsNamespacesYAML = `apiVersion: v1
kind: Namespace
metadata:
  name: arows
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: Namespace
metadata:
  name: arows-b
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: Namespace
metadata:
  name: outside
---
apiVersion: v1
kind: Namespace
metadata:
  name: joiner
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: server, namespace: arows}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: arows}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: other, namespace: arows}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: arows-b}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: plain, namespace: outside}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: joiner, namespace: joiner}
`

// captureMode is one of istio-cni's two ways of writing a pod's capture
// rules.
type captureMode struct {
	name string
	env  []string // the node agent's, over the chart's
	// rules lists a pod's rules (a command in the pod); istio-cni's hold
	// want.
	rules []string
	want  string
	tool  string // the package holding rules[0]
}

// captureModes are iptables (istio-cni's default) and native nftables.
var captureModes = []captureMode{
	{name: "iptables", rules: []string{"iptables-save", "-t", "nat"}, want: "ISTIO", tool: "iptables"},
	{name: "nftables", env: []string{"NATIVE_NFTABLES=true"}, rules: []string{"nft", "list", "tables"}, want: "istio", tool: "nftables"},
}

// startArowsLab brings the suite's lab up, istio-cni capturing in mode.
func startArowsLab(t *testing.T, mode captureMode) *arowsLab {
	t.Helper()
	netnslab.RequireTool(t, mode.rules[0], mode.tool)
	cp, lab := startControlPlane(t)
	ctx := t.Context()
	bin := ztunnelBinary(t)
	l := &arowsLab{cp: cp, mode: mode, cnis: make([]*CNI, 2), ztunnels: make([]*Ztunnel, 2)}
	for i := range l.cnis {
		l.cnis[i], l.ztunnels[i] = startMeshNode(t, cp, lab, fmt.Sprintf("node%d", i+1), bin, mode.env)
	}
	if _, err := cp.Kubectl(ctx, arowsNamespacesYAML, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	run := func(node int, spec PodSpec) *netnslab.Pod {
		t.Helper()
		pod, _, err := l.cnis[node].RunPod(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		return pod
	}
	l.server = run(0, PodSpec{Namespace: "arows", Name: "server", ServiceAccount: "server", Labels: map[string]string{"app": "server"}})
	l.client = run(1, PodSpec{Namespace: "arows", Name: "client", ServiceAccount: "client", Labels: map[string]string{"app": "client"}})
	l.other = run(1, PodSpec{Namespace: "arows", Name: "other", ServiceAccount: "other", Labels: map[string]string{"app": "other"}})
	l.clientB = run(1, PodSpec{Namespace: "arows-b", Name: "client-b", ServiceAccount: "client", Labels: map[string]string{"app": "client"}})
	l.plain = run(1, PodSpec{Namespace: "outside", Name: "plain", ServiceAccount: "plain", Labels: map[string]string{"app": "plain"}})
	l.optout = run(1, PodSpec{Namespace: "arows", Name: "optout", ServiceAccount: "client",
		Labels: map[string]string{"app": "optout", "istio.io/dataplane-mode": "none"}})
	l.joiner = run(1, PodSpec{Namespace: "joiner", Name: "joiner", ServiceAccount: "joiner", Labels: map[string]string{"app": "joiner"}})
	startEcho(t, l.server, serverPort)
	startEcho(t, l.server, otherPort)
	startEcho(t, l.plain, serverPort)
	return l
}

// TestARows runs the A-rows that need no Envoy through istiod and istio-cni,
// once per capture mode of istio-cni (iptables, its default, and native
// nftables), each on one lab of two nodes shared by the cases, one subtest
// per case; each applies Istio's objects with kubectl, checks their effect
// on calls and removes them, and each starts from the lab's default state
// (everything reachable, mesh pods over HBONE).
func TestARows(t *testing.T) {
	for _, mode := range captureModes {
		t.Run(mode.name, func(t *testing.T) {
			start := time.Now()
			l := startArowsLab(t, mode)
			t.Logf("lab up (control plane, two nodes, seven pods) in %v", time.Since(start).Round(100*time.Millisecond))
			for _, tc := range arowsCases {
				t.Run(tc.name, func(t *testing.T) {
					start := time.Now()
					l.baseline(t)
					tc.run(t, l)
					t.Logf("%s in %v", tc.name, time.Since(start).Round(100*time.Millisecond))
				})
			}
		})
	}
}

// arowsCase is one subtest of TestARows.
type arowsCase struct {
	name string
	run  func(t *testing.T, l *arowsLab)
}

// path is how a call arrives at the server's daemon.
type path int

const (
	viaHBONE     path = iota // mTLS from the client's daemon, both identities logged
	viaPlaintext             // captured inbound, no peer identity
)

func (p path) String() string { return [...]string{"HBONE", "plaintext"}[p] }

// baseline waits for the lab's default state: the mesh's clients reach the
// server over HBONE, the plain pod in plaintext (PERMISSIVE, the default),
// on both ports.
func (l *arowsLab) baseline(t *testing.T) {
	t.Helper()
	for _, port := range []int{serverPort, otherPort} {
		for _, c := range []*netnslab.Pod{l.client, l.other, l.clientB} {
			l.reach(t, c, port, viaHBONE)
		}
		l.reach(t, l.plain, port, viaPlaintext)
	}
}

// serverLog is the server's daemon's log (node1's).
func (l *arowsLab) serverLog() string { return l.ztunnels[0].Log() }

// clientLog is the clients' daemon's log (node2's).
func (l *arowsLab) clientLog() string { return l.ztunnels[1].Log() }

// inbound counts the server daemon's inbound access-log lines for a
// connection from pod to the server's port that match how: via (nil: any
// path) and, if refused is not empty, an error holding it (else no error).
func (l *arowsLab) inbound(from *netnslab.Pod, port int, via *path, refused string) int {
	n, _ := l.inboundLines(from, port, via, refused)
	return n
}

// inboundLines is inbound, with the last line counted.
func (l *arowsLab) inboundLines(from *netnslab.Pod, port int, via *path, refused string) (n int, last string) {
	dst := netip.AddrPortFrom(l.server.IP, uint16(port)).String()
	for line := range strings.Lines(l.serverLog()) {
		if !strings.Contains(line, `direction="inbound"`) || !strings.Contains(line, "src.addr="+from.IP.String()+":") {
			continue
		}
		// Over HBONE the port is the tunnel's target (dst.hbone_addr),
		// in plaintext the address dialled (dst.addr).
		if !hasField(line, "dst.hbone_addr", dst) && !hasField(line, "dst.addr", dst) {
			continue
		}
		if refused == "" && strings.Contains(line, "error=") || refused != "" && !strings.Contains(line, refused) {
			continue
		}
		if via != nil {
			hbone := strings.Contains(line, "src.identity=") && hasField(line, "dst.hbone_addr", dst)
			if hbone != (*via == viaHBONE) {
				continue
			}
		}
		n, last = n+1, strings.TrimSpace(line)
	}
	return n, last
}

// hasField reports whether an access-log line has key=value, the value
// quoted (strings) or not (addresses).
func hasField(line, key, value string) bool {
	return strings.Contains(line, key+"="+value+" ") || strings.Contains(line, key+`="`+value+`"`)
}

// reach waits until a call from pod to the server's port succeeds and the
// server's daemon logs it arriving via the path.
func (l *arowsLab) reach(t *testing.T, from *netnslab.Pod, port int, via path) {
	t.Helper()
	ctx := t.Context()
	dst := netip.AddrPortFrom(l.server.IP, uint16(port))
	waitUntil(t, 2*time.Minute, func() error {
		before := l.inbound(from, port, &via, "")
		if err := call(ctx, from, dst); err != nil {
			return fmt.Errorf("%s to %v: %w", from.Name, dst, err)
		}
		return waitLog(func() bool { return l.inbound(from, port, &via, "") > before },
			"%s to %v succeeded, but the server's daemon logged no inbound connection from it via %v", from.Name, dst, via)
	})
}

// refused waits until a call from pod to the server's port fails and the
// server's daemon logs the connection refused for reason.
func (l *arowsLab) refused(t *testing.T, from *netnslab.Pod, port int, reason string) {
	t.Helper()
	ctx := t.Context()
	dst := netip.AddrPortFrom(l.server.IP, uint16(port))
	waitUntil(t, time.Minute, func() error {
		before := l.inbound(from, port, nil, reason)
		if err := call(ctx, from, dst); err == nil {
			return fmt.Errorf("%s to %v: the call still succeeds", from.Name, dst)
		}
		return waitLog(func() bool { return l.inbound(from, port, nil, reason) > before },
			"%s to %v failed, but the server's daemon logged no refusal for %q", from.Name, dst, reason)
	})
	_, line := l.inboundLines(from, port, nil, reason)
	t.Logf("%s to %v refused: %s", from.Name, dst, line[strings.Index(line, "error="):])
}

// waitLog waits a few seconds for cond (a daemon logs a connection when it
// is complete, just after the call returns).
func waitLog(cond func() bool, format string, args ...any) error {
	if nettest.Until(5*time.Second, cond) {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// apply applies yaml with kubectl and deletes it when the test ends.
func (l *arowsLab) apply(t *testing.T, yaml string) {
	t.Helper()
	if _, err := l.cp.Kubectl(t.Context(), yaml, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// t.Context is done by now.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := l.cp.Kubectl(ctx, yaml, "delete", "--ignore-not-found", "-f", "-"); err != nil {
			t.Error(err)
		}
	})
}

// kubectl runs kubectl and fails the test on error.
func (l *arowsLab) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := l.cp.Kubectl(t.Context(), "", args...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// Reasons the daemon gives for a refusal (ztunnel's words).
const (
	noneAllowed = "allow policies exist, but none allowed"
	deniedBy    = "explicitly denied by: "
	rejected    = "policy rejection"
)

// arowsCases are TestARows' subtests, in the order they run: these, then
// those the init functions of arows_more_test.go and
// arows_services_test.go append (Go runs a package's files' init functions
// in file-name order).
var arowsCases = []arowsCase{
	{"A2_pod_IP_over_HBONE_and_plaintext_from_outside_the_mesh", func(t *testing.T, l *arowsLab) {
		// baseline checked it: mesh clients over HBONE with both identities,
		// the pod outside the mesh in plaintext. Say so with the lines.
		id := `src.identity="spiffe://cluster.local/ns/arows/sa/client"`
		if logLineWith(l.serverLog(), `direction="inbound"`, id, `dst.identity="spiffe://cluster.local/ns/arows/sa/server"`) == "" {
			t.Fatalf("no inbound HBONE line with both identities:\n%s", l.serverLog())
		}
	}},

	// A5: AuthorizationPolicy, L4.
	{"A5_allow_by_principals", func(t *testing.T, l *arowsLab) {
		l.apply(t, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-client, namespace: arows}
spec:
  selector: {matchLabels: {app: server}}
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/arows/sa/client"]
`)
		l.refused(t, l.other, serverPort, noneAllowed)
		l.refused(t, l.plain, serverPort, noneAllowed) // no mTLS, no principal
		l.reach(t, l.client, serverPort, viaHBONE)
		// The same service account name in another namespace is another
		// principal (cluster.local/ns/arows-b/sa/client).
		l.refused(t, l.clientB, serverPort, noneAllowed)
	}},
	{"A5_allow_by_namespaces", func(t *testing.T, l *arowsLab) {
		l.apply(t, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-arows-b, namespace: arows}
spec:
  selector: {matchLabels: {app: server}}
  action: ALLOW
  rules:
  - from:
    - source:
        namespaces: ["arows-b"]
`)
		l.refused(t, l.client, serverPort, noneAllowed)
		l.refused(t, l.other, serverPort, noneAllowed)
		l.reach(t, l.clientB, serverPort, viaHBONE)
	}},
	{"A5_allow_by_ports", func(t *testing.T, l *arowsLab) {
		l.apply(t, fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-port, namespace: arows}
spec:
  selector: {matchLabels: {app: server}}
  action: ALLOW
  rules:
  - to:
    - operation:
        ports: ["%d"]
`, serverPort))
		l.refused(t, l.client, otherPort, noneAllowed)
		l.refused(t, l.plain, otherPort, noneAllowed)
		l.reach(t, l.client, serverPort, viaHBONE)
		l.reach(t, l.plain, serverPort, viaPlaintext)
	}},
	{"A5_deny_wins_over_allow", func(t *testing.T, l *arowsLab) {
		l.apply(t, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-clients, namespace: arows}
spec:
  selector: {matchLabels: {app: server}}
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/arows/sa/client", "cluster.local/ns/arows/sa/other"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-client, namespace: arows}
spec:
  selector: {matchLabels: {app: server}}
  action: DENY
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/arows/sa/client"]
`)
		l.refused(t, l.client, serverPort, deniedBy+"arows/deny-client")
		l.reach(t, l.other, serverPort, viaHBONE)
	}},
	{"A5_empty_allow_denies_all", func(t *testing.T, l *arowsLab) {
		l.apply(t, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-nothing, namespace: arows}
spec:
  selector: {matchLabels: {app: server}}
  action: ALLOW
`)
		for _, c := range []*netnslab.Pod{l.client, l.other, l.clientB, l.plain} {
			l.refused(t, c, serverPort, noneAllowed)
		}
	}},
	{"A5_root_namespace_policy_applies_mesh_wide", func(t *testing.T, l *arowsLab) {
		l.apply(t, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-other-mesh-wide, namespace: istio-system}
spec:
  action: DENY
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/arows/sa/other"]
`)
		l.refused(t, l.other, serverPort, deniedBy+"istio-system/deny-other-mesh-wide")
		l.reach(t, l.client, serverPort, viaHBONE)
	}},

	// A4: PeerAuthentication.
	{"A4_strict_namespace", func(t *testing.T, l *arowsLab) {
		l.apply(t, `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: arows}
spec:
  mtls: {mode: STRICT}
`)
		l.refused(t, l.plain, serverPort, rejected)
		l.refused(t, l.plain, otherPort, rejected)
		l.reach(t, l.client, serverPort, viaHBONE)
		l.reach(t, l.clientB, serverPort, viaHBONE)
	}},
	{"A4_permissive_workload_under_strict_namespace", func(t *testing.T, l *arowsLab) {
		l.apply(t, `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: arows}
spec:
  mtls: {mode: STRICT}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: server-permissive, namespace: arows}
spec:
  selector: {matchLabels: {app: server}}
  mtls: {mode: PERMISSIVE}
`)
		l.reach(t, l.plain, serverPort, viaPlaintext)
		l.reach(t, l.client, serverPort, viaHBONE)
	}},
	{"A4_strict_mesh_wide", func(t *testing.T, l *arowsLab) {
		l.apply(t, `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec:
  mtls: {mode: STRICT}
`)
		l.refused(t, l.plain, serverPort, rejected)
		l.reach(t, l.client, serverPort, viaHBONE)
	}},
	{"A4_mesh_wide_strict_namespace_permissive", func(t *testing.T, l *arowsLab) {
		l.apply(t, `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec:
  mtls: {mode: STRICT}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: permissive, namespace: arows}
spec:
  mtls: {mode: PERMISSIVE}
`)
		l.reach(t, l.plain, serverPort, viaPlaintext)
		l.reach(t, l.client, serverPort, viaHBONE)
	}},
	{"A4_strict_with_a_permissive_port", func(t *testing.T, l *arowsLab) {
		l.apply(t, fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: server-ports, namespace: arows}
spec:
  selector: {matchLabels: {app: server}}
  mtls: {mode: STRICT}
  portLevelMtls:
    %d: {mode: PERMISSIVE}
`, otherPort))
		l.refused(t, l.plain, serverPort, rejected)
		l.reach(t, l.plain, otherPort, viaPlaintext)
		l.reach(t, l.client, serverPort, viaHBONE)
	}},
	{"A4_permissive_with_a_strict_port", func(t *testing.T, l *arowsLab) {
		l.apply(t, fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: server-ports, namespace: arows}
spec:
  selector: {matchLabels: {app: server}}
  mtls: {mode: PERMISSIVE}
  portLevelMtls:
    %d: {mode: STRICT}
`, otherPort))
		l.refused(t, l.plain, otherPort, rejected)
		l.reach(t, l.plain, serverPort, viaPlaintext)
		l.reach(t, l.client, otherPort, viaHBONE)
	}},
}
