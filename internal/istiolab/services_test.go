//go:build istiolab

package istiolab

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// plainServiceYAML is a Deployment of two replicas, a Service selecting
// them and a client, in a namespace outside the mesh.
const plainServiceYAML = `apiVersion: v1
kind: Namespace
metadata:
  name: plain
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: echo
  namespace: plain
spec:
  replicas: 2
  selector:
    matchLabels:
      app: echo
  template:
    metadata:
      labels:
        app: echo
    spec:
      containers:
      - name: echo
        image: istiolab.invalid/echo
---
apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: plain
spec:
  selector:
    app: echo
  ports:
  - name: tcp-echo
    port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: plain
spec:
  containers:
  - name: client
    image: istiolab.invalid/client
`

// TestServiceVIP checks the runtime's kube-proxy part for pods outside the
// mesh: a client's calls to a Service's ClusterIP are spread over both
// replicas (on two nodes), a replica reaches its own Service (hairpin),
// and kubernetes.default's VIP, 10.96.0.1:443, leads to the API server,
// whose certificate carries the Service's names.
func TestServiceVIP(t *testing.T) {
	cp, lab := startControlPlane(t)
	ctx := t.Context()
	bin := ztunnelBinary(t)
	cnis := make([]*CNI, 2)
	for i := range cnis {
		cnis[i], _ = startMeshNode(t, cp, lab, fmt.Sprintf("node%d", i+1), bin, nil)
	}
	rt := startRuntime(t, cp, cnis...)
	if _, err := cp.Kubectl(ctx, plainServiceYAML, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	client := rt.waitPod(t, "plain/client")
	var echoes []*echoServer
	var replicas []string
	waitUntil(t, 2*time.Minute, func() error {
		out, err := cp.Kubectl(ctx, "", "get", "pods", "-n", "plain", "-l", "app=echo", "-o",
			`jsonpath={range .items[*]}{.metadata.name}{" "}{end}`)
		if err != nil {
			return err
		}
		if replicas = strings.Fields(string(out)); len(replicas) != 2 {
			return fmt.Errorf("%d replicas, want 2", len(replicas))
		}
		for _, r := range replicas {
			if _, ok := rt.pod("plain/" + r); !ok {
				return fmt.Errorf("the runtime has not started %s", r)
			}
		}
		return nil
	})
	for _, r := range replicas {
		pod, _ := rt.pod("plain/" + r)
		echoes = append(echoes, startEcho(t, pod, 8080))
	}
	out, err := cp.Kubectl(ctx, "", "get", "service", "echo", "-n", "plain", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatal(err)
	}
	vip, err := netip.ParseAddr(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("the Service's ClusterIP %q: %v", out, err)
	}
	dst := netip.AddrPortFrom(vip, 80)

	// Calls from the client until each replica has answered one: the
	// rules pick an endpoint at random.
	waitUntil(t, 2*time.Minute, func() error {
		if err := call(ctx, client, dst); err != nil {
			return fmt.Errorf("client to %s: %w", dst, err)
		}
		for i, e := range echoes {
			if e.count() == 0 {
				return fmt.Errorf("replica %s has not been reached through %s yet", replicas[i], dst)
			}
		}
		return nil
	})
	// A replica calling its own Service: its connection may come back to
	// itself, which only the hairpin masquerade lets it answer.
	self, _ := rt.pod("plain/" + replicas[0])
	for range 8 {
		waitUntil(t, time.Minute, func() error { return call(ctx, self, dst) })
	}

	// kubernetes.default, as a pod's in-cluster client reaches it.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(cp.CAPEM)
	httpc := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext:       client.Dial,
			TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: "kubernetes.default.svc", MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		},
	}
	want, err := cp.bins.Version("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, func() error {
		resp, err := httpc.Get("https://10.96.0.1/version")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var v struct{ GitVersion string }
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			return err
		}
		if v.GitVersion != want {
			return fmt.Errorf("10.96.0.1 answered version %q, want %q", v.GitVersion, want)
		}
		return nil
	})
}
