package istiolab

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
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

// ztunnelTokenTTL is the chart's expirationSeconds for the token. A kubelet
// renews it at 80% of that; no lab run lasts that long yet.
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
// o.Pod's node, running) and runs the daemon in o.Pod with the chart's
// environment (manifests/charts/ztunnel/templates/daemonset.yaml), a token
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
	uid, err := cp.WritePod(ctx, PodObject{
		Namespace: IstioNamespace, Name: name, ServiceAccount: ZtunnelServiceAccount,
		Node: o.Pod.Node, IP: o.Pod.IP, Container: "istio-proxy",
		Labels: map[string]string{
			"sidecar.istio.io/inject": "false", "istio.io/dataplane-mode": "none",
			"app": "ztunnel", "app.kubernetes.io/name": "ztunnel",
		},
		Annotations: map[string]string{"sidecar.istio.io/inject": "false", "istio.io/rev": "default"},
	})
	if err != nil {
		return nil, err
	}
	token, err := cp.PodToken(ctx, IstioNamespace, ZtunnelServiceAccount, name, uid, []string{"istio-ca"}, ztunnelTokenTTL)
	if err != nil {
		return nil, err
	}
	root, err := cp.RootCert(ctx, IstioNamespace)
	if err != nil {
		return nil, err
	}
	for path, data := range map[string][]byte{tokenFile: []byte(token), rootFile: root} {
		full := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			return nil, fmt.Errorf("istiolab: %w", err)
		}
		if err := os.WriteFile(full, data, 0o600); err != nil {
			return nil, fmt.Errorf("istiolab: %w", err)
		}
	}
	istiod := cp.IstiodAddr().String()
	version, err := cp.bins.Version("istio")
	if err != nil {
		return nil, err
	}
	env := []string{
		// The image's (pilot/docker/Dockerfile.ztunnel): the daemon sends it
		// to istiod in its node metadata, which istiod warns without.
		"ISTIO_META_ISTIO_VERSION=" + version,
		// What the kubelet gives every pod.
		"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443",
		// The chart's env, in its order.
		"CA_ADDRESS=" + istiod,
		"XDS_ADDRESS=" + istiod,
		"RUST_LOG=info",
		"RUST_BACKTRACE=1",
		"ISTIO_META_CLUSTER_ID=Kubernetes",
		"INPOD_ENABLED=true",
		"TERMINATION_GRACE_PERIOD_SECONDS=" + strconv.Itoa(int(ZtunnelGrace/time.Second)),
		"POD_NAME=" + name,
		"POD_NAMESPACE=" + IstioNamespace,
		"NODE_NAME=" + o.Pod.Node.Name,
		"INSTANCE_IP=" + o.Pod.IP.String(),
		"SERVICE_ACCOUNT=" + ZtunnelServiceAccount,
		"ISTIO_META_ENABLE_HBONE=true", // the mesh's defaultConfig.proxyMetadata
		"ZTUNNEL_CPU_LIMIT=2",          // limits.cpu unset: the node's allocatable CPUs
		// The lab's differences (the doc above).
		"ALT_XDS_HOSTNAME=" + istiodName,
		"ALT_CA_HOSTNAME=" + istiodName,
		"INPOD_UDS=" + o.InpodUDS,
	}
	p, err := startProcess(o.Pod.NS, name, dir, cp.logDir, o.Binary, []string{"proxy", "ztunnel"}, append(env, o.Env...))
	if err != nil {
		return nil, err
	}
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
