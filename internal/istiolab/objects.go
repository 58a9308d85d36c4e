package istiolab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// The lab has no kubelet: what a kubelet writes to the API server (its Node,
// a Pod's status) the lab writes itself, with the fields Istio reads.

// RegisterNode writes node's Node object as a kubelet registers its node:
// the hostname label, the pod CIDR, the node's address and Ready.
func (cp *ControlPlane) RegisterNode(ctx context.Context, node *netnslab.Node) error {
	obj := map[string]any{
		"apiVersion": "v1",
		"kind":       "Node",
		"metadata": map[string]any{
			"name": node.Name,
			"labels": map[string]string{
				"kubernetes.io/hostname": node.Name,
				"kubernetes.io/os":       "linux",
			},
		},
		"spec": map[string]any{
			"podCIDR":  node.PodCIDR.String(),
			"podCIDRs": []string{node.PodCIDR.String()},
		},
	}
	if err := cp.apply(ctx, obj); err != nil {
		return err
	}
	now := time.Now().UTC().Format(time.RFC3339)
	err := cp.patchStatus(ctx, "node", "", node.Name, map[string]any{
		"addresses": []map[string]string{
			{"type": "InternalIP", "address": node.IP.String()},
			{"type": "Hostname", "address": node.Name},
		},
		"conditions": []map[string]string{{
			"type": "Ready", "status": "True", "reason": "KubeletReady",
			"lastHeartbeatTime": now, "lastTransitionTime": now,
		}},
	})
	if err != nil {
		return err
	}
	return cp.startNodeLease(ctx, node.Name)
}

// Node leases, as a kubelet keeps them: kube-controller-manager's node
// lifecycle controller marks a node whose lease (kube-node-lease/<node>) was
// not renewed within its grace period (50 s) NotReady, taints it, marks its
// pods not Ready (which istiod would serve as unhealthy workloads) and later
// evicts them.
const (
	nodeLeaseNamespace = "kube-node-lease"
	// nodeLeaseDuration is the kubelet's nodeLeaseDurationSeconds; it
	// renews every quarter of it.
	nodeLeaseDuration = 40 * time.Second
)

// startNodeLease creates the node's Lease and renews it until the control
// plane closes; a node registered again keeps its one renewal loop.
func (cp *ControlPlane) startNodeLease(ctx context.Context, node string) error {
	cp.mu.Lock()
	if cp.leases == nil {
		cp.leases = make(map[string]bool)
	}
	running := cp.leases[node]
	cp.leases[node] = true
	cp.mu.Unlock()
	if running {
		return nil
	}
	lease := map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": node, "namespace": nodeLeaseNamespace},
		"spec": map[string]any{
			"holderIdentity":       node,
			"leaseDurationSeconds": int(nodeLeaseDuration / time.Second),
			"renewTime":            microTime(time.Now()),
		},
	}
	path := "/apis/coordination.k8s.io/v1/namespaces/" + nodeLeaseNamespace + "/leases"
	var conflict *apiError
	if err := cp.api.do(ctx, http.MethodPost, path, lease, nil); err != nil && !(errors.As(err, &conflict) && conflict.Code == http.StatusConflict) {
		cp.mu.Lock()
		delete(cp.leases, node)
		cp.mu.Unlock()
		return fmt.Errorf("istiolab: lease of node %s: %w", node, err)
	}
	cp.bgDone.Go(func() {
		tick := time.NewTicker(nodeLeaseDuration / 4)
		defer tick.Stop()
		for {
			select {
			case <-cp.bg.Done():
				return
			case <-tick.C:
			}
			// A failed renewal is retried at the next tick, as the
			// kubelet's; the grace period covers a few.
			_ = cp.api.mergePatch(cp.bg, path+"/"+node, map[string]any{"spec": map[string]any{"renewTime": microTime(time.Now())}})
		}
	})
	return nil
}

// microTime formats t as the API's MicroTime (RFC 3339 with microseconds).
func microTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00") }

// PodObject describes a Pod the lab runs, for its object on the API server.
type PodObject struct {
	// Namespace and Name name the Pod.
	Namespace, Name string
	// ServiceAccount is spec.serviceAccountName.
	ServiceAccount string
	// Node is the netnslab node it runs on (spec.nodeName, status.hostIP).
	Node *netnslab.Node
	// IP is status.podIP.
	IP netip.Addr
	// Labels and Annotations are the Pod's.
	Labels, Annotations map[string]string
	// Container is the one container's name ("app" if empty); its image is
	// a placeholder, as no runtime pulls it.
	Container string
	// HostNetwork is spec.hostNetwork: the pod shares its node's network
	// namespace (IP is then the node's).
	HostNetwork bool
}

// WritePod creates the Pod object as a scheduler and kubelet would leave it
// running: bound to its node, then its status written with its IP, phase
// Running and Ready. It returns the Pod's UID.
func (cp *ControlPlane) WritePod(ctx context.Context, p PodObject) (string, error) {
	uid, err := cp.CreatePod(ctx, p)
	if err != nil {
		return "", err
	}
	return uid, cp.WritePodRunning(ctx, p)
}

func (p PodObject) container() string {
	if p.Container == "" {
		return "app"
	}
	return p.Container
}

// CreatePod creates the Pod object bound to its node, with no status yet:
// what the kubelet finds before it sets the pod's sandbox up (and runs the
// CNI plugins). It returns the Pod's UID.
func (cp *ControlPlane) CreatePod(ctx context.Context, p PodObject) (string, error) {
	container := p.container()
	meta := map[string]any{"namespace": p.Namespace, "name": p.Name}
	if p.Labels != nil {
		meta["labels"] = p.Labels
	}
	if p.Annotations != nil {
		meta["annotations"] = p.Annotations
	}
	spec := map[string]any{
		"nodeName":           p.Node.Name,
		"serviceAccountName": p.ServiceAccount,
		"containers":         []map[string]any{{"name": container, "image": "istiolab.invalid/" + container}},
	}
	if p.HostNetwork {
		spec["hostNetwork"] = true
	}
	obj := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
	if err := cp.apply(ctx, obj); err != nil {
		return "", err
	}
	out, err := cp.Kubectl(ctx, "", "get", "pod", p.Name, "-n", p.Namespace, "-o", "jsonpath={.metadata.uid}")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// WritePodRunning writes the status a kubelet writes once the pod's
// sandbox and container run: its IP, phase Running and Ready.
func (cp *ControlPlane) WritePodRunning(ctx context.Context, p PodObject) error {
	container := p.container()
	now := time.Now().UTC().Format(time.RFC3339)
	var conditions []map[string]string
	for _, c := range []string{"PodScheduled", "Initialized", "ContainersReady", "Ready"} {
		conditions = append(conditions, map[string]string{"type": c, "status": "True", "lastTransitionTime": now})
	}
	return cp.patchStatus(ctx, "pod", p.Namespace, p.Name, map[string]any{
		"phase":      "Running",
		"podIP":      p.IP.String(),
		"podIPs":     []map[string]string{{"ip": p.IP.String()}},
		"hostIP":     p.Node.IP.String(),
		"hostIPs":    []map[string]string{{"ip": p.Node.IP.String()}},
		"startTime":  now,
		"conditions": conditions,
		"containerStatuses": []map[string]any{{
			"name": container, "ready": true, "started": true, "restartCount": 0,
			"image": "istiolab.invalid/" + container, "imageID": "",
			"state": map[string]any{"running": map[string]string{"startedAt": now}},
		}},
	})
}

// apply writes obj with `kubectl apply -f -` (JSON is YAML).
func (cp *ControlPlane) apply(ctx context.Context, obj any) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	_, err = cp.Kubectl(ctx, string(data), "apply", "-f", "-")
	return err
}

// patchStatus merges status into an object's status subresource, as its
// controller (here: the kubelet) writes it.
func (cp *ControlPlane) patchStatus(ctx context.Context, kind, namespace, name string, status map[string]any) error {
	data, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	args := []string{"patch", kind, name, "--subresource=status", "--type=merge", "-p", string(data)}
	if namespace != "" {
		args = append(args, "-n", namespace)
	}
	if _, err := cp.Kubectl(ctx, "", args...); err != nil {
		return fmt.Errorf("istiolab: status of %s %s: %w", kind, name, err)
	}
	return nil
}
