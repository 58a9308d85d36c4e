package istiolab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// The lab's runtime for pods written by others (kubectl apply of Pod YAML):
// what a scheduler and a kubelet do for them, as far as Istio cares.

// apiPod is the part of a Pod the runtime reads.
type apiPod struct {
	Metadata struct {
		Namespace string            `json:"namespace"`
		Name      string            `json:"name"`
		UID       string            `json:"uid"`
		Labels    map[string]string `json:"labels"`
		// DeletionTimestamp is set once the pod is being deleted: its
		// node's kubelet stops it and deletes the object for good.
		DeletionTimestamp string `json:"deletionTimestamp"`
	} `json:"metadata"`
	Spec struct {
		NodeName           string `json:"nodeName"`
		HostNetwork        bool   `json:"hostNetwork"`
		ServiceAccountName string `json:"serviceAccountName"`
		Containers         []struct {
			Name string `json:"name"`
		} `json:"containers"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
}

// RuntimeOptions run the lab's runtime for pods applied by others.
type RuntimeOptions struct {
	// CNIs are the nodes' istio-cni, by node name; a pod bound to another
	// node is not the runtime's.
	CNIs map[string]*CNI
	// Started, if set, is told of each pod started (namespace, name, its
	// lab namespace).
	Started func(namespace, name string, pod *netnslab.Pod)
	// Stopped, if set, is told of each pod whose sandbox was stopped (its
	// lab namespace is gone).
	Stopped func(namespace, name string)
	// Logf, if set, is told of each step and failure.
	Logf func(format string, args ...any)
	// Interval is how often the runtime lists pods (default 1 s).
	Interval time.Duration
}

// RunRuntime starts, until ctx ends, the pods others write: a pending Pod
// with no node is bound to one of o.CNIs' nodes in turn (the scheduler's
// part), and a pending Pod bound to one of them is started as RunPod starts
// one (its sandbox, its process, istio-cni's plugin, its status). A pod the
// runtime or RunPod started that is being deleted (a deletionTimestamp) has
// its sandbox stopped as a kubelet stops it (CNI DEL, its process and
// cgroups, its network namespace) and its object then deleted with grace 0,
// the kubelet's final delete, which istio-cni's agent sees and so removes
// the pod from the node's daemon; a started pod whose object is gone is
// stopped the same way. Pods are found by listing them every o.Interval.
// On the same beat it programs each node's Service VIPs as kube-proxy
// would, from the Services and EndpointSlices (services.go).
func (cp *ControlPlane) RunRuntime(ctx context.Context, o RuntimeOptions) {
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	var nodes []string
	for name := range o.CNIs {
		nodes = append(nodes, name)
	}
	next := 0
	failed := make(map[string]bool)       // by UID: tried once, left as it is
	programmed := make(map[string][]byte) // by node: the Service rules loaded last
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for {
		var list struct {
			Items []apiPod `json:"items"`
		}
		listed := time.Now()
		err := cp.api.do(ctx, http.MethodGet, "/api/v1/pods", nil, &list)
		if err != nil && ctx.Err() == nil {
			o.Logf("istiolab runtime: listing pods: %v", err)
		}
		exists := make(map[string]bool, len(list.Items))
		for _, p := range list.Items {
			exists[p.Metadata.UID] = true
			if p.Metadata.DeletionTimestamp != "" {
				cp.terminate(ctx, o, p)
				continue
			}
			if p.Spec.HostNetwork || (p.Status.Phase != "" && p.Status.Phase != "Pending") || failed[p.Metadata.UID] {
				continue
			}
			key := p.Metadata.Namespace + "/" + p.Metadata.Name
			if p.Spec.NodeName == "" {
				if len(nodes) == 0 {
					continue
				}
				node := nodes[next%len(nodes)]
				next++
				if err := cp.bind(ctx, p, node); err != nil {
					o.Logf("istiolab runtime: binding %s to %s: %v", key, node, err)
					failed[p.Metadata.UID] = true
				}
				continue
			}
			c, ok := o.CNIs[p.Spec.NodeName]
			if !ok {
				continue
			}
			pod, err := c.startExisting(ctx, p)
			if err != nil {
				o.Logf("istiolab runtime: starting %s: %v", key, err)
				failed[p.Metadata.UID] = true
				continue
			}
			o.Logf("istiolab runtime: started %s on %s at %s", key, p.Spec.NodeName, pod.IP)
			if o.Started != nil {
				o.Started(p.Metadata.Namespace, p.Metadata.Name, pod)
			}
		}
		cp.syncServices(ctx, o, programmed)
		if err == nil {
			// Sandboxes of pods deleted at once (grace 0, or gone before a
			// list saw them terminating); only those started before the
			// list, which would be in it.
			for _, c := range o.CNIs {
				for _, s := range c.sandboxList() {
					if !exists[s.uid] && s.started.Before(listed) {
						cp.stopStarted(ctx, o, c, s)
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// syncServices is kube-proxy's part (services.go): the Services'
// rules rendered from the API server's state and loaded into each node
// whose rules differ from programmed, which it updates.
func (cp *ControlPlane) syncServices(ctx context.Context, o RuntimeOptions, programmed map[string][]byte) {
	rules, err := cp.serviceRules(ctx)
	if err != nil {
		if ctx.Err() == nil {
			o.Logf("istiolab runtime: listing services: %v", err)
		}
		return
	}
	for name, c := range o.CNIs {
		if bytes.Equal(programmed[name], rules) {
			continue
		}
		if err := programServices(ctx, c.Node, rules); err != nil {
			if ctx.Err() == nil {
				o.Logf("istiolab runtime: %v", err)
			}
			continue
		}
		programmed[name] = rules
	}
}

// terminate is the kubelet's part for a pod being deleted on one of
// o.CNIs' nodes: its sandbox stopped if it was started, then the final
// delete. A running pod the runtime did not start (the lab's own agents and
// daemons) is left alone.
func (cp *ControlPlane) terminate(ctx context.Context, o RuntimeOptions, p apiPod) {
	c, ok := o.CNIs[p.Spec.NodeName]
	if !ok {
		return
	}
	key := p.Metadata.Namespace + "/" + p.Metadata.Name
	if s, ok := c.sandboxOf(p.Metadata.UID); ok {
		cp.stopStarted(ctx, o, c, s)
	} else if p.Status.Phase != "" && p.Status.Phase != "Pending" {
		return
	}
	// The kubelet's final delete: grace 0, and only this pod (a new one of
	// the same name is another UID).
	opts := map[string]any{
		"apiVersion": "v1", "kind": "DeleteOptions",
		"gracePeriodSeconds": 0,
		"preconditions":      map[string]string{"uid": p.Metadata.UID},
	}
	path := fmt.Sprintf("/api/v1/namespaces/%s/pods/%s", p.Metadata.Namespace, p.Metadata.Name)
	var apiErr *apiError
	if err := cp.api.do(ctx, http.MethodDelete, path, opts, nil); err != nil &&
		!(errors.As(err, &apiErr) && (apiErr.Code == http.StatusNotFound || apiErr.Code == http.StatusConflict)) {
		o.Logf("istiolab runtime: deleting %s: %v", key, err)
		return
	}
	o.Logf("istiolab runtime: deleted %s", key)
}

// stopStarted stops a sandbox the runtime or RunPod started and tells
// o.Stopped.
func (cp *ControlPlane) stopStarted(ctx context.Context, o RuntimeOptions, c *CNI, s *sandbox) {
	key := s.obj.Namespace + "/" + s.obj.Name
	if err := c.stopSandbox(ctx, s); err != nil {
		o.Logf("istiolab runtime: stopping %s: %v", key, err)
	} else {
		o.Logf("istiolab runtime: stopped %s on %s", key, c.Node.Name)
	}
	if o.Stopped != nil {
		o.Stopped(s.obj.Namespace, s.obj.Name)
	}
}

// bind binds the pod to node through its binding subresource, as the
// scheduler does.
func (cp *ControlPlane) bind(ctx context.Context, p apiPod, node string) error {
	binding := map[string]any{
		"apiVersion": "v1", "kind": "Binding",
		"metadata": map[string]string{"name": p.Metadata.Name, "namespace": p.Metadata.Namespace},
		"target":   map[string]string{"apiVersion": "v1", "kind": "Node", "name": node},
	}
	return cp.api.do(ctx, http.MethodPost,
		fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/binding", p.Metadata.Namespace, p.Metadata.Name), binding, nil)
}

// labName is a pod's name in the lab (a network namespace's): unique
// among the lab's nodes and pods, within netnslab's alphabet and length.
var labNameBad = regexp.MustCompile(`[^a-z0-9-]+`)

func labName(namespace, name string) string {
	s := labNameBad.ReplaceAllString(strings.ToLower(namespace+"-"+name), "-")
	if len(s) > 40 {
		s = s[:40]
	}
	return strings.Trim(s, "-")
}

// startExisting starts a Pod object others wrote, bound to c's node: its
// sandbox, its process, istio-cni's plugin and its running status.
func (c *CNI) startExisting(ctx context.Context, p apiPod) (*netnslab.Pod, error) {
	pod, err := c.Node.AddPod(labName(p.Metadata.Namespace, p.Metadata.Name))
	if err != nil {
		return nil, err
	}
	obj := PodObject{
		Namespace: p.Metadata.Namespace, Name: p.Metadata.Name, ServiceAccount: p.Spec.ServiceAccountName,
		Node: c.Node, IP: pod.IP,
	}
	if len(p.Spec.Containers) > 0 {
		obj.Container = p.Spec.Containers[0].Name
	}
	if err := c.sandbox(ctx, pod, obj, p.Metadata.UID); err != nil {
		return nil, err
	}
	return pod, nil
}
