// Package istiolab runs upstream Kubernetes and Istio in the network-namespace
// lab (issue 33, docs/istio-lab.md): etcd, the Kubernetes API server,
// kube-controller-manager and istiod, unmodified programs built from the
// istiolab/ module by `make istio-bins`, started as processes in a lab node,
// with Istio's and the Gateway API's CRDs and an ambient-profile install
// rendered by Helm from Istio's own charts applied with kubectl; istiod,
// istio-cni's agent and the daemon get their rendered containers' arguments
// and environment.
//
// Its single job is running upstream Kubernetes and Istio around the lab's
// nodes: the control plane (start it, hand out what a client needs:
// kubeconfig, service-account tokens from the TokenRequest API, istiod's
// address; stop it), and on each node istio-cni's node agent in a root of
// its own with the chart's host mounts, the daemon as the ztunnel chart runs
// it, and the runtime's part for pods: their objects, their sandboxes and
// istio-cni's CNI plugin invoked as a container runtime invokes it, on ADD
// and, once a pod is deleted, on DEL; and the restarts and rotations a
// cluster makes (a DaemonSet rollout of the daemon, istiod restarted, a CA
// plugged into istiod), with a kubelet's part for their mounted tokens and
// the daemon's root ConfigMap. It never imports Kubernetes or Istio code:
// the daemon's module must not take their dependency graph, so it talks to
// the API server through kubectl and a few plain HTTPS calls. Each
// component's output goes to a log file under the control plane's directory.
//
// Its tests run only when ZTUNNEL_ISTIOLAB_BIN names the programs' directory
// (`make test-istio` sets it): the programs take about eleven minutes to
// build cold, which neither make test nor CI pays.
//
// Imports (of ours): internal/netnslab. Imported by: cmd/zlab (`zlab
// istio`).
package istiolab
