//go:build istiolab

package istiolab

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestControllerManager checks that the control plane runs Kubernetes'
// controllers as a cluster does: a new namespace gets its `default`
// ServiceAccount and `kube-root-ca.crt`, a Deployment its ReplicaSet and
// Pods (pending: no runtime here), a Service its EndpointSlice, a registered
// node's Lease is renewed, and a deleted Namespace goes away with what it
// held.
func TestControllerManager(t *testing.T) {
	cp, lab := startControlPlane(t)
	ctx := t.Context()
	node, err := lab.AddNode("node1")
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.RegisterNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	leaseRenewed := leaseRenewTime(t, cp, "node1")

	const ns = "kcm"
	if _, err := cp.Kubectl(ctx, `apiVersion: v1
kind: Namespace
metadata:
  name: `+ns+`
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: `+ns+`
spec:
  replicas: 2
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: web
        image: istiolab.invalid/web
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: `+ns+`
spec:
  selector:
    app: web
  ports:
  - port: 80
    targetPort: 8080
`, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	// get returns kubectl get's jsonpath output in the namespace.
	get := func(jsonpath string, args ...string) (string, error) {
		out, err := cp.Kubectl(ctx, "", append(append([]string{"get"}, args...), "-n", ns, "-o", "jsonpath="+jsonpath)...)
		return strings.TrimSpace(string(out)), err
	}
	for _, c := range []struct {
		what, jsonpath, want string
		args                 []string
	}{
		{"the serviceaccount controller's default ServiceAccount", "{.metadata.name}", "default", []string{"serviceaccount", "default"}},
		{"the root-ca-cert publisher's ConfigMap", "{.metadata.name}", "kube-root-ca.crt", []string{"configmap", "kube-root-ca.crt"}},
		{"the deployment controller's ReplicaSet", "{.items[0].spec.replicas}", "2", []string{"replicaset", "-l", "app=web"}},
		{"the replicaset controller's Pods", "{range .items[*]}{.metadata.ownerReferences[0].kind} {end}", "ReplicaSet ReplicaSet", []string{"pod", "-l", "app=web"}},
		{"the endpointslice controller's EndpointSlice", "{.items[0].metadata.labels.endpointslice\\.kubernetes\\.io/managed-by}", "endpointslice-controller.k8s.io", []string{"endpointslice", "-l", "kubernetes.io/service-name=web"}},
	} {
		waitUntil(t, time.Minute, func() error {
			got, err := get(c.jsonpath, c.args...)
			if err != nil || got != c.want {
				return fmt.Errorf("%s: %q (%v), want %q", c.what, got, err, c.want)
			}
			return nil
		})
	}

	// The node lifecycle controller reads the node's Lease: the lab renews
	// it as a kubelet does, so the node stays Ready.
	waitUntil(t, time.Minute, func() error {
		if now := leaseRenewTime(t, cp, "node1"); now == leaseRenewed {
			return fmt.Errorf("lease kube-node-lease/node1 not renewed since %s", now)
		}
		return nil
	})

	// The namespace controller empties and removes a deleted namespace
	// (the Deployment's pods go at once: no kubelet holds them).
	if _, err := cp.Kubectl(ctx, "", "delete", "namespace", ns, "--wait=false"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 2*time.Minute, func() error {
		out, err := cp.Kubectl(ctx, "", "get", "namespace", ns, "--ignore-not-found", "-o", "name")
		if err != nil || len(out) != 0 {
			return fmt.Errorf("namespace %s still there: %q (%v)", ns, out, err)
		}
		return nil
	})
}

// leaseRenewTime returns the renewTime of node's Lease.
func leaseRenewTime(t *testing.T, cp *ControlPlane, node string) string {
	t.Helper()
	out, err := cp.Kubectl(t.Context(), "", "get", "lease", node, "-n", nodeLeaseNamespace, "-o", "jsonpath={.spec.renewTime}")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
