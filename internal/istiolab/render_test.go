//go:build istiolab

package istiolab

import (
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestRenderedInstall: Helm renders Istio's charts as the lab installs them
// (no lab needed): the objects applied are the kinds the lab's programs
// read, the ones that need a Service endpoint or a controller's pods are
// left out, and each program's environment is its rendered container's as
// a kubelet resolves it (envFrom, fieldRef, resourceFieldRef rounded up),
// with the lab's values set (the images' tag, istio-cni sharing the node's
// network namespace).
func TestRenderedInstall(t *testing.T) {
	bins, err := OpenBins(requireBins(t))
	if err != nil {
		t.Fatal(err)
	}
	cp := &ControlPlane{cfg: Config{Dir: t.TempDir()}, bins: bins}
	r, err := cp.renderInstall(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	applied, err := r.installYAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"kind: ServiceAccount", "name: ztunnel\n", "name: istio-cni-config", "name: istio-sidecar-injector",
		"kind: DaemonSet", "name: istiod-clusterrole-istio-system", "kind: RoleBinding",
	} {
		if !strings.Contains(applied, want) {
			t.Errorf("applied install lacks %q", want)
		}
	}
	for _, kind := range []string{"CustomResourceDefinition", "Deployment", "Service", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "HorizontalPodAutoscaler"} {
		if strings.Contains(applied, "\nkind: "+kind+"\n") {
			t.Errorf("applied install holds a %s", kind)
		}
		if _, err := r.find(kind, "istiod"); err != nil && (kind == "Deployment" || kind == "Service") {
			t.Errorf("rendered install: %v", err)
		}
	}
	version, err := bins.Version("istio")
	if err != nil {
		t.Fatal(err)
	}
	cpus := strconv.Itoa(runtime.NumCPU())
	for _, tc := range []struct {
		kind, name, container string
		f                     podFields
		args                  []string
		env, absent           []string
	}{
		{
			"DaemonSet", "ztunnel", "istio-proxy",
			podFields{name: "ztunnel-n1", namespace: IstioNamespace, node: "n1", podIP: "10.0.0.9", hostIP: "10.0.0.1", serviceAccount: "ztunnel"},
			[]string{"proxy", "ztunnel"},
			[]string{
				"CA_ADDRESS=istiod.istio-system.svc:15012", "INPOD_ENABLED=true", "TERMINATION_GRACE_PERIOD_SECONDS=30",
				"POD_NAME=ztunnel-n1", "POD_NAMESPACE=istio-system", "NODE_NAME=n1", "INSTANCE_IP=10.0.0.9",
				"SERVICE_ACCOUNT=ztunnel", "ISTIO_META_ENABLE_HBONE=true",
				"ZTUNNEL_CPU_LIMIT=" + cpus,      // no limit: the node's allocatable
				"ZTUNNEL_RESOURCE_CPU_REQUEST=1", // 200m, rounded up to the divisor 1
			},
			nil,
		},
		{
			"DaemonSet", "istio-cni-node", "install-cni",
			podFields{name: "istio-cni-node-n1", namespace: IstioNamespace, node: "n1", podIP: "10.0.0.1", hostIP: "10.0.0.1", serviceAccount: "istio-cni"},
			[]string{"--log_output_level=info"},
			[]string{
				"AMBIENT_ENABLED=true", "CHAINED_CNI_PLUGIN=true", "NATIVE_NFTABLES=false", "EXCLUDE_NAMESPACES=kube-system",
				"CURRENT_AGENT_VERSION=" + version, "REPAIR_NODE_NAME=n1", "NODE_NAME=n1", "POD_NAME=istio-cni-node-n1",
				"GOMAXPROCS=" + cpus,
			},
			// ambient.shareHostNetworkNamespace: the agent stays in the node's
			// network namespace.
			[]string{"ALLOW_SWITCH_TO_HOST_NS"},
		},
		{
			"Deployment", "istiod", "discovery",
			podFields{name: "istiod-lab", namespace: IstioNamespace, serviceAccount: "istiod"},
			[]string{"discovery", "--monitoringAddr=:15014", "--log_output_level=default:info", "--domain", "cluster.local", "--keepaliveMaxServerConnectionAge", "30m"},
			[]string{
				"PILOT_ENABLE_AMBIENT=true", "CA_TRUSTED_NODE_ACCOUNTS=istio-system/ztunnel", "PILOT_CERT_PROVIDER=istiod",
				"POD_NAME=istiod-lab", "SERVICE_ACCOUNT=istiod", "GOMAXPROCS=" + cpus,
			},
			nil,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, env, err := r.containerSpec(tc.kind, tc.name, tc.container, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(args, tc.args) {
				t.Errorf("args %q, want %q", args, tc.args)
			}
			for _, want := range tc.env {
				if !slices.Contains(env, want) {
					t.Errorf("env lacks %s", want)
				}
			}
			for _, name := range tc.absent {
				if slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, name+"=") }) {
					t.Errorf("env holds %s", name)
				}
			}
		})
	}
	labels, annotations, err := r.podMeta("DaemonSet", "ztunnel")
	if err != nil {
		t.Fatal(err)
	}
	if labels["app"] != "ztunnel" || labels["istio.io/dataplane-mode"] != "none" || annotations["prometheus.io/port"] != "15020" {
		t.Errorf("ztunnel's pod template: labels %v, annotations %v", labels, annotations)
	}
	if got := withEnv([]string{"A=1", "B=2"}, "B=3", "C=4"); !slices.Equal(got, []string{"A=1", "B=3", "C=4"}) {
		t.Errorf("withEnv: %q", got)
	}
}
