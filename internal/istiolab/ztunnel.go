package istiolab

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// The files the ztunnel chart mounts, relative to the daemon's working
// directory: the daemon's defaults are these same relative paths, so the
// lab sets no variable for them, as the chart sets none.
const (
	tokenFile = "var/run/secrets/tokens/istio-token"  // projected token, audience istio-ca
	rootFile  = "var/run/secrets/istio/root-cert.pem" // ConfigMap istio-ca-root-cert
)

// ztunnelTokenTTL is the chart's expirationSeconds for the token. The lab,
// as a kubelet, renews it at 80% of that (mountToken).
const ztunnelTokenTTL = 12 * time.Hour

// ztunnelReadyTimeout bounds a daemon's start: xDS from istiod, its own
// certificate and the CNI agent's first snapshot.
const ztunnelReadyTimeout = 2 * time.Minute

// ZtunnelOptions start the daemon on one node as the ztunnel chart's
// DaemonSet runs it.
type ZtunnelOptions struct {
	// Binary is the daemon (bin/ztunnel). Required.
	Binary string
	// Pod is the daemon's own pod namespace on its node. Required.
	Pod *netnslab.Pod
	// InpodUDS is the CNI agent's ZDS socket (the chart's hostPath
	// /var/run/ztunnel/ztunnel.sock, per node in the lab). Required.
	InpodUDS string
	// Env adds or overrides variables after the chart's.
	Env []string
	// Name is the daemon's Pod object in IstioNamespace, its working
	// directory and its log's name; default "ztunnel-<node>". A rollout's
	// new pod takes another name beside the old, as a DaemonSet's pods
	// have (TerminateZtunnel then ends the old one).
	Name string
}

// Ztunnel is one daemon started by StartZtunnel.
type Ztunnel struct {
	// Pod is where it runs.
	Pod *netnslab.Pod
	// Name is its Pod object's name in IstioNamespace (and its log's).
	Name string
	proc *process
}

// StartZtunnel writes the daemon's Pod object (the chart's DaemonSet pod on
// o.Pod's node, running) and runs the daemon in o.Pod with the arguments
// and environment of the DaemonSet Helm rendered from the ztunnel chart, a token
// bound to that Pod from the TokenRequest API and istiod's root from the istio-ca-root-cert ConfigMap
// in the files the chart mounts, and waits until it is ready. Two things
// differ from a cluster, as the lab has no cluster DNS yet: XDS_ADDRESS and
// CA_ADDRESS name istiod by its address, and ALT_XDS_HOSTNAME and
// ALT_CA_HOSTNAME give the name its certificate carries (the chart's
// address).
func (cp *ControlPlane) StartZtunnel(ctx context.Context, o ZtunnelOptions) (*Ztunnel, error) {
	if o.Binary == "" || o.Pod == nil || o.InpodUDS == "" {
		return nil, fmt.Errorf("istiolab: ZtunnelOptions needs Binary, Pod and InpodUDS")
	}
	name := o.Name
	if name == "" {
		name = "ztunnel-" + o.Pod.Node.Name
	}
	dir := cp.dir(name)
	// The DaemonSet's pod, as the scheduler and the kubelet leave it: istiod
	// lets a node account impersonate only pods on the node of the pod its
	// token is bound to, the daemon's own identity included (shared mode
	// asks for every certificate that way).
	labels, annotations, err := cp.rendered.podMeta("DaemonSet", "ztunnel")
	if err != nil {
		return nil, err
	}
	uid, err := cp.WritePod(ctx, PodObject{
		Namespace: IstioNamespace, Name: name, ServiceAccount: ZtunnelServiceAccount,
		Node: o.Pod.Node, IP: o.Pod.IP, Container: "istio-proxy",
		Labels: labels, Annotations: annotations,
	})
	if err != nil {
		return nil, err
	}
	// The kubelet's part for the chart's volumes, for as long as this pod
	// runs: the istio-ca token bound to the pod, renewed at 80% of its
	// lifetime, and istio-ca-root-cert, synced when istiod changes it (a
	// root rotation), each swapped in whole.
	gone := make(chan struct{})
	var proc *process
	defer func() {
		if proc == nil {
			close(gone)
		}
	}()
	if err := cp.mountToken(ctx, tokenVolume{
		dir: filepath.Join(dir, filepath.Dir(tokenFile)),
		files: func(token string) map[string][]byte {
			return map[string][]byte{filepath.Base(tokenFile): []byte(token)}
		},
		namespace: IstioNamespace, serviceAccount: ZtunnelServiceAccount, audiences: []string{"istio-ca"},
		ttl: ztunnelTokenTTL, bound: &boundObjectRef{Kind: "Pod", APIVersion: "v1", Name: name, UID: uid},
		until: gone,
	}); err != nil {
		return nil, err
	}
	// istiod writes the ConfigMap shortly after it sees the namespace.
	if _, err := cp.RootCert(ctx, IstioNamespace); err != nil {
		return nil, err
	}
	if err := cp.mountConfigMap(ctx, IstioNamespace, "istio-ca-root-cert", filepath.Join(dir, filepath.Dir(rootFile)), gone); err != nil {
		return nil, err
	}
	istiod := cp.IstiodAddr().String()
	version, err := cp.bins.Version("istio")
	if err != nil {
		return nil, err
	}
	// The rendered DaemonSet's container as a kubelet starts it in this
	// pod, the Downward API resolved (ZTUNNEL_CPU_LIMIT, with no limit set,
	// is the node's allocatable CPUs).
	args, chartEnv, err := cp.rendered.containerSpec("DaemonSet", "ztunnel", "istio-proxy", podFields{
		name: name, namespace: IstioNamespace, node: o.Pod.Node.Name, podIP: o.Pod.IP.String(),
		hostIP: o.Pod.Node.IP.String(), serviceAccount: ZtunnelServiceAccount,
	})
	if err != nil {
		return nil, err
	}
	env := append([]string{
		// The image's (pilot/docker/Dockerfile.ztunnel): the daemon sends it
		// to istiod in its node metadata, which istiod warns without.
		"ISTIO_META_ISTIO_VERSION=" + version,
		// What the kubelet gives every pod.
		"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443",
	}, chartEnv...)
	env = withEnv(env,
		// The lab's differences (the doc above).
		"CA_ADDRESS="+istiod,
		"XDS_ADDRESS="+istiod,
		"ALT_XDS_HOSTNAME="+istiodName,
		"ALT_CA_HOSTNAME="+istiodName,
		"INPOD_UDS="+o.InpodUDS,
	)
	env = withEnv(env, o.Env...)
	p, err := startProcess(o.Pod.NS, name, dir, cp.logDir, o.Binary, args, env)
	if err != nil {
		return nil, err
	}
	proc = p
	cp.bgDone.Go(func() {
		select {
		case <-p.exited:
		case <-cp.bg.Done():
		}
		close(gone)
	})
	z := &Ztunnel{Pod: o.Pod, Name: name, proc: p}
	client := &http.Client{
		Transport: &http.Transport{DialContext: o.Pod.Dial, DisableKeepAlives: true},
		Timeout:   5 * time.Second,
	}
	err = waitFor(ctx, p, ztunnelReadyTimeout, func(ctx context.Context) error {
		return probeOK(ctx, client, "http://127.0.0.1:15021/healthz/ready", fmt.Sprintf("%s /healthz/ready", name))
	})
	if err != nil {
		_ = p.stop(stopGrace)
		return nil, err
	}
	return z, nil
}

// Log returns the daemon's output so far.
func (z *Ztunnel) Log() string {
	data, _ := os.ReadFile(z.proc.logPath)
	return string(data)
}

// Stop ends the daemon (SIGTERM, then SIGKILL after a grace period).
func (z *Ztunnel) Stop() error { return z.proc.stop(stopGrace) }

// istiodName is the name istiod's serving certificate carries: the mesh
// config's discoveryAddress host, which every client verifies.
const istiodName = "istiod." + IstioNamespace + ".svc"

// RootCert returns the mesh's root certificate as istiod publishes it in
// namespace (the istio-ca-root-cert ConfigMap its namespace controller
// writes), waiting up to a minute for istiod to write it.
func (cp *ControlPlane) RootCert(ctx context.Context, namespace string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		out, err := cp.Kubectl(ctx, "", "get", "configmap", "istio-ca-root-cert", "-n", namespace,
			"-o", `jsonpath={.data.root-cert\.pem}`, "--ignore-not-found")
		if err == nil && strings.Contains(string(out), "BEGIN CERTIFICATE") {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("istiolab: no istio-ca-root-cert in namespace %s: %w (last: %v)", namespace, ctx.Err(), err)
		case <-tick.C:
		}
	}
}
