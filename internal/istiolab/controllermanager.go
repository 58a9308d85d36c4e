package istiolab

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// kube-controller-manager, unmodified, beside the API server: the
// controllers a cluster runs by default, which turn Deployments into
// ReplicaSets and Pods, Services into EndpointSlices, give each namespace its
// `default` ServiceAccount and `kube-root-ca.crt`, and finish a deleted
// Namespace.

// controllerManagerUser is the user the API server's bootstrap RBAC policy
// gives kube-controller-manager's roles (system:kube-controller-manager and
// the reader of the extension-apiserver-authentication ConfigMap).
const controllerManagerUser = "system:kube-controller-manager"

// controllerManagerReadyTimeout bounds the controller manager's start, to
// the first `default` ServiceAccount its serviceaccount controller writes.
const controllerManagerReadyTimeout = 2 * time.Minute

// controllerManagerControllers is --controllers: every controller on by
// default except the DaemonSet controller. The lab runs each node's
// DaemonSet pods itself (istio-cni's agent, the daemon: StartCNI,
// StartZtunnel) and writes their Pod objects; the controller would adopt
// those, replace them for their missing template hash and make pods no
// runtime starts.
const controllerManagerControllers = "*,-daemonset-controller"

// startControllerManager runs kube-controller-manager in the control
// plane's node as kubeadm's static pod does: its own identity (a static
// token for system:kube-controller-manager, its kubeconfig also used for
// delegated authentication and authorization), a service account per
// controller (--use-service-account-credentials), the service-account key
// the legacy token controller signs with and the API server's CA for
// kube-root-ca.crt. It returns once the serviceaccount controller wrote the
// default namespace's `default` ServiceAccount.
func (cp *ControlPlane) startControllerManager(ctx context.Context, pki *apiPKI, files map[string]string) error {
	dir := cp.dir("kube-controller-manager")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("istiolab: %w", err)
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, kubeconfig(cp.Server, pki.caPEM, controllerManagerUser, pki.kcmToken), 0o600); err != nil {
		return fmt.Errorf("istiolab: %w", err)
	}
	p, err := cp.start("kube-controller-manager", dir, cp.bins.KubeControllerManager(), []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		// Its own HTTPS port (health, metrics) on the node's loopback, as
		// kubeadm binds it; its certificate is self-signed in dir.
		"--bind-address=127.0.0.1",
		"--cert-dir=" + dir,
		"--controllers=" + controllerManagerControllers,
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + files["sa.key"],
		"--root-ca-file=" + files["ca.crt"],
		"--cluster-name=istiolab",
		"--profiling=false",
	}, nil)
	if err != nil {
		return err
	}
	return waitFor(ctx, p, controllerManagerReadyTimeout, func(ctx context.Context) error {
		return cp.api.do(ctx, http.MethodGet, "/api/v1/namespaces/default/serviceaccounts/default", nil, nil)
	})
}
