package istiolab

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// BinsEnv names the directory of the upstream programs for the lab's tests
// (`make test-istio` sets it to bin/istiolab); unset, they skip.
const BinsEnv = "ZTUNNEL_ISTIOLAB_BIN"

// Bins is the directory `make istio-bins` (scripts/istio-bins.sh) fills:
// the upstream programs, Helm, the CRDs and the charts copied out of their
// modules.
type Bins struct {
	// Dir is the directory's path.
	Dir string
}

// OpenBins checks that dir holds every program and file the lab runs.
func OpenBins(dir string) (Bins, error) {
	b := Bins{Dir: dir}
	for _, p := range []string{b.Etcd(), b.KubeAPIServer(), b.KubeControllerManager(), b.Kubectl(), b.Istiod(), b.CNIAgent(), b.CNIPlugin(), b.IstioCRDs(), b.GatewayAPICRDs(), b.Helm()} {
		if _, err := os.Stat(p); err != nil {
			return Bins{}, fmt.Errorf("istiolab: %w (run make istio-bins)", err)
		}
	}
	for _, rel := range helmReleases {
		if _, err := os.Stat(filepath.Join(b.Chart(rel.chart), "Chart.yaml")); err != nil {
			return Bins{}, fmt.Errorf("istiolab: %w (run make istio-bins)", err)
		}
	}
	return b, nil
}

// Helm is Helm's command, which renders Istio's charts.
func (b Bins) Helm() string { return filepath.Join(b.Dir, "helm") }

// Chart is the directory of one of Istio's charts ("base",
// "istio-discovery", "istio-cni", "ztunnel").
func (b Bins) Chart(name string) string { return filepath.Join(b.Dir, "charts", name) }

// Etcd is etcd's server.
func (b Bins) Etcd() string { return filepath.Join(b.Dir, "etcd") }

// KubeAPIServer is Kubernetes' API server.
func (b Bins) KubeAPIServer() string { return filepath.Join(b.Dir, "kube-apiserver") }

// KubeControllerManager is Kubernetes' controller manager.
func (b Bins) KubeControllerManager() string { return filepath.Join(b.Dir, "kube-controller-manager") }

// Kubectl is Kubernetes' command-line client.
func (b Bins) Kubectl() string { return filepath.Join(b.Dir, "kubectl") }

// Istiod is Istio's pilot-discovery.
func (b Bins) Istiod() string { return filepath.Join(b.Dir, "pilot-discovery") }

// CNIAgent is istio-cni's node agent (install-cni).
func (b Bins) CNIAgent() string { return filepath.Join(b.Dir, "install-cni") }

// CNIPlugin is istio-cni's CNI plugin, which the node agent installs.
func (b Bins) CNIPlugin() string { return filepath.Join(b.Dir, "istio-cni") }

// IstioCRDs is Istio's CRDs (manifests/charts/base/files/crd-all.gen.yaml).
func (b Bins) IstioCRDs() string { return filepath.Join(b.Dir, "crds", "istio.yaml") }

// GatewayAPICRDs is the Gateway API's experimental channel, through its
// own kustomization.
func (b Bins) GatewayAPICRDs() string { return filepath.Join(b.Dir, "crds", "gateway-api.yaml") }

// Version returns what the versions file says was built for name
// ("etcd", "kubernetes", "istio", "gateway-api"): its first word after the
// name.
func (b Bins) Version(name string) (string, error) {
	data, err := os.ReadFile(filepath.Join(b.Dir, "versions"))
	if err != nil {
		return "", fmt.Errorf("istiolab: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == name {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("istiolab: no %s in %s", name, filepath.Join(b.Dir, "versions"))
}
