//go:build istiolab

package istiolab

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// deploymentYAML is a Deployment of three replicas and a Service selecting
// them, in the mesh by their namespace, and a client pod beside them.
const deploymentYAML = `apiVersion: v1
kind: Namespace
metadata:
  name: demo
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: web
  namespace: demo
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: client
  namespace: demo
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: demo
spec:
  replicas: 3
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      serviceAccountName: web
      containers:
      - name: web
        image: istiolab.invalid/web
        ports:
        - containerPort: 8080
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  selector:
    app: web
  ports:
  - name: tcp-echo
    port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: demo
spec:
  serviceAccountName: client
  containers:
  - name: client
    image: istiolab.invalid/client
`

// webPod is a replica as the API server lists it.
type webPod struct {
	name, uid, node string
	pod             *netnslab.Pod
}

// TestDeployment runs a Deployment through the whole lab:
// kube-controller-manager makes its ReplicaSet and pods, the runtime
// schedules them over two nodes and starts them through istio-cni, which
// enrols them with the nodes' daemons; the replicas reach each other
// through HBONE; the Service gets its EndpointSlice, and a client pod's call
// to the Service's ClusterIP reaches a replica through the daemons (the
// mesh resolves the VIP: the lab has no kube-proxy). Scaled to one, the two
// pods removed go through the runtime's stop (CNI DEL) and out of their
// daemon's state, and the call through the VIP still works. The namespace
// deleted, its pods are stopped and it goes.
func TestDeployment(t *testing.T) {
	cp, lab := startControlPlane(t)
	ctx := t.Context()
	bin := ztunnelBinary(t)
	cnis := make([]*CNI, 2)
	daemons := make(map[string]*Ztunnel, 2)
	for i := range cnis {
		name := fmt.Sprintf("node%d", i+1)
		var z *Ztunnel
		cnis[i], z = startMeshNode(t, cp, lab, name, bin, nil)
		daemons[name] = z
	}
	rt := startRuntime(t, cp, cnis...)
	if _, err := cp.Kubectl(ctx, deploymentYAML, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}

	// replicas lists the Deployment's running pods the runtime started,
	// each with an echo on its port once.
	echoes := make(map[string]bool)
	replicas := func() ([]webPod, error) {
		out, err := cp.Kubectl(ctx, "", "get", "pods", "-n", "demo", "-l", "app=web", "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.spec.nodeName} {.metadata.deletionTimestamp}{"\n"}{end}`)
		if err != nil {
			return nil, err
		}
		var pods []webPod
		for line := range strings.Lines(string(out)) {
			f := strings.Fields(line)
			if len(f) != 3 { // not bound yet, or terminating
				continue
			}
			p := webPod{name: f[0], uid: f[1], node: f[2]}
			var ok bool
			if p.pod, ok = rt.pod("demo/" + p.name); !ok {
				return nil, fmt.Errorf("the runtime has not started %s", p.name)
			}
			pods = append(pods, p)
		}
		return pods, nil
	}
	var web []webPod
	waitUntil(t, 2*time.Minute, func() error {
		var err error
		if web, err = replicas(); err != nil {
			return err
		}
		if len(web) != 3 {
			return fmt.Errorf("%d replicas running, want 3", len(web))
		}
		return nil
	})
	nodes := map[string]int{}
	for _, p := range web {
		nodes[p.node]++
		if !echoes[p.uid] {
			startEcho(t, p.pod, 8080)
			echoes[p.uid] = true
		}
	}
	if len(nodes) != 2 {
		t.Fatalf("replicas on nodes %v, want both nodes", nodes)
	}
	client := rt.waitPod(t, "demo/client")
	// Each daemon runs a proxy for each pod of the mesh on its node: the
	// three replicas and the client, enrolled by istio-cni.
	waitUntil(t, time.Minute, func() error {
		total := 0
		for _, z := range daemons {
			n, err := metricValue(ctx, z, "workload_manager_active_proxy_count")
			if err != nil {
				return err
			}
			total += int(n)
		}
		if total != 4 {
			return fmt.Errorf("the daemons run %d proxies, want 4 (three replicas and the client)", total)
		}
		return nil
	})

	// The replicas reach each other through HBONE, across the nodes.
	for _, from := range web {
		for _, to := range web {
			if from.node == to.node {
				continue
			}
			hbone := []string{"connection complete", `direction="inbound"`, "src.addr=" + from.pod.IP.String() + ":",
				`src.identity="spiffe://cluster.local/ns/demo/sa/web"`, `dst.identity="spiffe://cluster.local/ns/demo/sa/web"`}
			waitUntil(t, 2*time.Minute, func() error {
				if err := call(ctx, from.pod, netip.AddrPortFrom(to.pod.IP, 8080)); err != nil {
					return fmt.Errorf("%s to %s: %w", from.name, to.name, err)
				}
				if logLineWith(daemons[to.node].Log(), hbone...) == "" {
					return fmt.Errorf("%s to %s: the call succeeded, but not through HBONE", from.name, to.name)
				}
				return nil
			})
		}
	}

	// The Service's EndpointSlice lists the ready replicas.
	readyEndpoints := func(want int) {
		t.Helper()
		waitUntil(t, time.Minute, func() error {
			out, err := cp.Kubectl(ctx, "", "get", "endpointslices", "-n", "demo", "-l", "kubernetes.io/service-name=web", "-o",
				`jsonpath={range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]} {end}`)
			if err != nil {
				return err
			}
			if got := len(strings.Fields(string(out))); got != want {
				return fmt.Errorf("the Service's EndpointSlices list %d ready endpoints (%s), want %d", got, out, want)
			}
			return nil
		})
	}
	readyEndpoints(3)

	out, err := cp.Kubectl(ctx, "", "get", "service", "web", "-n", "demo", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatal(err)
	}
	vip, err := netip.ParseAddr(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("the Service's ClusterIP %q: %v", out, err)
	}
	// callVIP calls the Service from the client; the client's daemon logs
	// the call outbound through HBONE to the Service's host name.
	callVIP := func() {
		t.Helper()
		viaService := []string{"connection complete", `direction="outbound"`, "src.addr=" + client.IP.String() + ":",
			`dst.service="web.demo.svc.cluster.local"`, "dst.hbone_addr="}
		clientDaemon := daemons[client.Node.Name]
		waitUntil(t, 2*time.Minute, func() error {
			before := logLinesWith(clientDaemon.Log(), viaService...)
			if err := call(ctx, client, netip.AddrPortFrom(vip, 80)); err != nil {
				return fmt.Errorf("client to %s:80: %w", vip, err)
			}
			if nettest.Until(5*time.Second, func() bool { return logLinesWith(clientDaemon.Log(), viaService...) > before }) {
				return nil
			}
			return fmt.Errorf("client to %s:80: the call succeeded, but its daemon logged no outbound HBONE connection to the Service", vip)
		})
	}
	callVIP()
	t.Logf("through the Service's VIP: %s", logLineWith(daemons[client.Node.Name].Log(), `direction="outbound"`, `dst.service="web.demo.svc.cluster.local"`))

	// Scaled to one: two replicas are deleted by the ReplicaSet, stopped by
	// the runtime, and dropped by their daemons.
	if _, err := cp.Kubectl(ctx, "", "scale", "deployment", "web", "-n", "demo", "--replicas=1"); err != nil {
		t.Fatal(err)
	}
	var left []webPod
	waitUntil(t, 2*time.Minute, func() error {
		var err error
		if left, err = replicas(); err != nil {
			return err
		}
		out, err := cp.Kubectl(ctx, "", "get", "pods", "-n", "demo", "-l", "app=web", "-o", "name")
		if err != nil {
			return err
		}
		if n := len(strings.Fields(string(out))); n != 1 || len(left) != 1 {
			return fmt.Errorf("%d pods of the Deployment (%d running), want 1", n, len(left))
		}
		return nil
	})
	for _, p := range web {
		if p.uid == left[0].uid {
			continue
		}
		if !rt.logged("stopped demo/" + p.name + " on " + p.node) {
			t.Errorf("the runtime did not stop %s's sandbox", p.name)
		}
		if _, ok := rt.pod("demo/" + p.name); ok {
			t.Errorf("%s is still started", p.name)
		}
		waitUntil(t, time.Minute, func() error {
			if logLineWith(daemons[p.node].Log(), "pod delete request", p.uid) == "" {
				return fmt.Errorf("the daemon on %s was not told %s is gone", p.node, p.name)
			}
			return nil
		})
	}
	waitUntil(t, time.Minute, func() error {
		total := 0
		for _, z := range daemons {
			n, err := metricValue(ctx, z, "workload_manager_active_proxy_count")
			if err != nil {
				return err
			}
			total += int(n)
		}
		if total != 2 {
			return fmt.Errorf("the daemons run %d proxies, want 2 (one replica and the client)", total)
		}
		return nil
	})
	readyEndpoints(1)
	callVIP()

	// The namespace deleted: its pods are deleted by the namespace
	// controller, stopped by the runtime, and the namespace goes once they
	// are; the daemons run no proxy any more.
	if _, err := cp.Kubectl(ctx, "", "delete", "namespace", "demo", "--wait=false"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 2*time.Minute, func() error {
		out, err := cp.Kubectl(ctx, "", "get", "namespace", "demo", "--ignore-not-found", "-o", "name")
		if err != nil || len(out) != 0 {
			return fmt.Errorf("namespace demo still there: %q (%v)", out, err)
		}
		for node, z := range daemons {
			n, err := metricValue(ctx, z, "workload_manager_active_proxy_count")
			if err != nil || n != 0 {
				return fmt.Errorf("the daemon on %s runs %v proxies (%v), want 0", node, n, err)
			}
		}
		return nil
	})
	for _, key := range []string{"demo/client", "demo/" + left[0].name} {
		if _, ok := rt.pod(key); ok {
			t.Errorf("%s is still started after its namespace went", key)
		}
	}
	istiodNotRefused(t, cp)
}
