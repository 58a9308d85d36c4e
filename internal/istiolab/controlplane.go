package istiolab

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// Addresses inside the control plane's node. etcd listens on the node's
// loopback only: nothing but the API server talks to it.
const (
	etcdClientURL = "http://127.0.0.1:2379"
	etcdPeerURL   = "http://127.0.0.1:2380"
	// APIServerPort is the API server's secure port on the node's address.
	APIServerPort = 6443
	// ServiceCIDR is the Service VIP range; the API server's own Service,
	// kubernetes.default, takes its first address.
	ServiceCIDR = "10.96.0.0/16"
	// IstiodXDSPort is istiod's TLS xDS and CA port, IstiodReadyPort serves
	// its /ready (the chart's readiness probe) and IstiodMonitoringPort its
	// metrics.
	IstiodXDSPort        = 15012
	IstiodReadyPort      = 8080
	IstiodMonitoringPort = 15014
	// IstioNamespace is where istiod, its CA secret and mesh config live.
	IstioNamespace = "istio-system"
	// istiodServiceAccount is istiod's service account in IstioNamespace,
	// which the istio-discovery chart's roles are bound to.
	istiodServiceAccount = "istiod"
	// ZtunnelServiceAccount is the daemon's service account in
	// IstioNamespace; istiod trusts it to ask for the certificates of pods on
	// its node (CA_TRUSTED_NODE_ACCOUNTS).
	ZtunnelServiceAccount = "ztunnel"
)

// How long each component gets to become ready. Generous: the lab's
// machine is shared, and a cold API server installs its bootstrap roles
// and priority levels before /readyz passes (about 20 s here).
const (
	etcdReadyTimeout      = time.Minute
	apiServerReadyTimeout = 3 * time.Minute
	istiodReadyTimeout    = 3 * time.Minute
	stopGrace             = 15 * time.Second
)

// Config says where the control plane runs and from what.
type Config struct {
	// Bins is the directory `make istio-bins` filled (Bins' layout).
	// Required.
	Bins string
	// Dir holds the control plane's state: etcd's data, the API server's
	// keys, the kubeconfigs, istiod's working directory and every
	// component's log (logs/<component>.log). Required; created if missing.
	Dir string
	// Node is the lab namespace everything runs in (a node of its own, as
	// e2e's "cp"). Required.
	Node *netnslab.Node
	// Logf, if set, is told each step.
	Logf func(format string, args ...any)
}

// ControlPlane is etcd, the Kubernetes API server and istiod, unmodified
// upstream programs, running in one lab node, with Istio's and the Gateway
// API's CRDs and an ambient mesh config installed.
type ControlPlane struct {
	// Node is where the control plane runs.
	Node *netnslab.Node
	// Server is the API server's URL on the node's address.
	Server string
	// Kubeconfig is the admin's kubeconfig (system:masters through a
	// static token), for kubectl inside the lab's namespaces.
	Kubeconfig string
	// CAPEM is the root the API server's certificate chains to.
	CAPEM []byte

	cfg    Config
	bins   Bins
	logDir string
	api    *apiClient
	procs  []*process // in start order

	// bg ends with Close: the loops that run as long as the control plane
	// (node leases); bgDone waits for them.
	bg     context.Context
	stopBg context.CancelFunc
	bgDone sync.WaitGroup

	mu      sync.Mutex           // guards the following fields
	nodes   map[string]*nodeHost // by node name
	cgroups []string             // the lab's cgroups above pods', shared by the nodes
	leases  map[string]bool      // nodes whose Lease is being renewed
	// tokenVolumes are the token volumes being renewed (mountToken), each
	// with the channel that ends its renewal.
	tokenVolumes map[string]chan struct{}
	// tokenRenewal, if set (a time.Duration), replaces the kubelet's
	// renewal at 80% of a token's lifetime (tests).
	tokenRenewal atomic.Int64

	// rendered is the install as Helm rendered it (install).
	rendered *rendered
}

// Start brings the control plane up and returns once istiod is ready. On
// failure it stops what it started; the logs stay in cfg.Dir.
func Start(ctx context.Context, cfg Config) (cp *ControlPlane, err error) {
	if cfg.Node == nil || cfg.Dir == "" || cfg.Bins == "" {
		return nil, errors.New("istiolab: Config needs Node, Dir and Bins")
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	bins, err := OpenBins(cfg.Bins)
	if err != nil {
		return nil, err
	}
	cp = &ControlPlane{
		Node:   cfg.Node,
		Server: "https://" + netip.AddrPortFrom(cfg.Node.IP, APIServerPort).String(),
		cfg:    cfg,
		bins:   bins,
		logDir: filepath.Join(cfg.Dir, "logs"),
		nodes:  make(map[string]*nodeHost),
	}
	cp.bg, cp.stopBg = context.WithCancel(context.Background())
	// The returns below set cp to nil: close what was started through a
	// copy.
	started := cp
	defer func() {
		if err != nil {
			started.Close()
			cp = nil
		}
	}()
	for _, d := range []string{cp.logDir, cp.dir("etcd"), cp.dir("apiserver"), cp.dir("istiod"), cp.dir("home")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("istiolab: %w", err)
		}
	}
	if err := cp.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if err := cp.install(ctx); err != nil {
		return nil, err
	}
	if err := cp.startIstiod(ctx); err != nil {
		return nil, err
	}
	return cp, nil
}

func (cp *ControlPlane) dir(name string) string { return filepath.Join(cp.cfg.Dir, name) }

// LogPath returns the log file of component ("etcd", "kube-apiserver",
// "istiod").
func (cp *ControlPlane) LogPath(component string) string {
	return filepath.Join(cp.logDir, component+".log")
}

func (cp *ControlPlane) start(name, dir, bin string, args, env []string) (*process, error) {
	cp.cfg.Logf("istiolab: starting %s", name)
	p, err := startProcess(cp.Node.NS, name, dir, cp.logDir, bin, args, env)
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, p)
	return p, nil
}

func (cp *ControlPlane) startEtcd(ctx context.Context) error {
	p, err := cp.start("etcd", cp.dir("etcd"), cp.bins.Etcd(), []string{
		"--name=istiolab",
		"--data-dir=" + filepath.Join(cp.dir("etcd"), "data"),
		"--listen-client-urls=" + etcdClientURL,
		"--advertise-client-urls=" + etcdClientURL,
		"--listen-peer-urls=" + etcdPeerURL,
		"--initial-advertise-peer-urls=" + etcdPeerURL,
		"--initial-cluster=istiolab=" + etcdPeerURL,
		// A throwaway lab: losing the last writes to a crash costs nothing,
		// and fsync on a shared disk is the API server's slowest step.
		"--unsafe-no-fsync",
	}, nil)
	if err != nil {
		return err
	}
	client := cp.probeClient()
	return waitFor(ctx, p, etcdReadyTimeout, func(ctx context.Context) error {
		return probeOK(ctx, client, etcdClientURL+"/health", "etcd /health")
	})
}

func (cp *ControlPlane) startAPIServer(ctx context.Context) error {
	dir := cp.dir("apiserver")
	pki, err := newAPIPKI([]netip.Addr{cp.Node.IP, netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("127.0.0.1")})
	if err != nil {
		return err
	}
	files, err := pki.write(dir)
	if err != nil {
		return err
	}
	cp.CAPEM = pki.caPEM
	cp.Kubeconfig = filepath.Join(cp.cfg.Dir, "kubeconfig")
	if err := os.WriteFile(cp.Kubeconfig, kubeconfig(cp.Server, pki.caPEM, adminUser, pki.adminToken), 0o600); err != nil {
		return fmt.Errorf("istiolab: %w", err)
	}
	p, err := cp.start("kube-apiserver", dir, cp.bins.KubeAPIServer(), []string{
		"--etcd-servers=" + etcdClientURL,
		"--advertise-address=" + cp.Node.IP.String(),
		"--bind-address=0.0.0.0",
		"--secure-port=" + strconv.Itoa(APIServerPort),
		"--cert-dir=" + dir,
		"--tls-cert-file=" + files["apiserver.crt"],
		"--tls-private-key-file=" + files["apiserver.key"],
		"--service-cluster-ip-range=" + ServiceCIDR,
		// Service-account tokens as a cluster issues them: TokenRequest signs
		// with this key, TokenReview (istiod's CA) verifies with it.
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + files["sa.pub"],
		"--service-account-signing-key-file=" + files["sa.key"],
		"--authorization-mode=RBAC",
		"--token-auth-file=" + files["tokens.csv"],
		// Client certificates under the lab's CA and request-header
		// authentication as kubeadm configures them: the API server
		// publishes both in kube-system/extension-apiserver-authentication,
		// which delegated authentication (kube-controller-manager's own
		// port) reads.
		"--client-ca-file=" + files["ca.crt"],
		"--requestheader-client-ca-file=" + files["front-proxy-ca.crt"],
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--allow-privileged=true",
		"--profiling=false",
	}, nil)
	if err != nil {
		return err
	}
	cp.api = newAPIClient(cp.Node.NS, cp.Server, pki.caPEM, pki.adminToken)
	if err := waitFor(ctx, p, apiServerReadyTimeout, cp.api.ready); err != nil {
		return err
	}
	return cp.startControllerManager(ctx, pki, files)
}

// install applies the CRDs from Istio's and the Gateway API's modules (as
// `make istio-bins` copied them), the istio-system namespace (helm install
// --create-namespace) and the objects of the ambient install, rendered by
// Helm from Istio's charts, that the lab's programs read (installKinds).
func (cp *ControlPlane) install(ctx context.Context) error {
	r, err := cp.renderInstall(ctx)
	if err != nil {
		return err
	}
	objs, err := r.installYAML()
	if err != nil {
		return err
	}
	cp.rendered = r
	for _, f := range []string{cp.bins.IstioCRDs(), cp.bins.GatewayAPICRDs()} {
		cp.cfg.Logf("istiolab: applying %s", filepath.Base(f))
		// Server-side: the largest CRDs overflow the annotation a
		// client-side apply keeps.
		if _, err := cp.Kubectl(ctx, "", "apply", "--server-side", "-f", f); err != nil {
			return err
		}
	}
	if _, err := cp.Kubectl(ctx, "", "wait", "--for=condition=Established", "crd", "--all", "--timeout=120s"); err != nil {
		return err
	}
	ns := "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + IstioNamespace + "\n"
	_, err = cp.Kubectl(ctx, ns+objs, "apply", "-f", "-")
	return err
}

func (cp *ControlPlane) startIstiod(ctx context.Context) error {
	dir := cp.dir("istiod")
	// istiod's own kubeconfig, as in-cluster configuration gives it on a
	// cluster: its service account's token from the TokenRequest API (the
	// kubelet's projected volume), renewed in place, under the
	// istio-discovery chart's roles (as rendered, install).
	saDir := filepath.Join(dir, "serviceaccount")
	tokenPath := filepath.Join(saDir, "token")
	if err := cp.mountToken(ctx, tokenVolume{
		dir: saDir, files: func(token string) map[string][]byte { return map[string][]byte{"token": []byte(token)} },
		namespace: IstioNamespace, serviceAccount: istiodServiceAccount, ttl: projectedTokenTTL,
	}); err != nil {
		return err
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, kubeconfigTokenFile(cp.Server, cp.CAPEM, "istiod", tokenPath), 0o600); err != nil {
		return fmt.Errorf("istiolab: %w", err)
	}
	// The rendered Deployment's container as a kubelet starts it for a pod
	// "istiod-lab" of service account istiod; the lab's override is the
	// kubeconfig (the chart points KUBECONFIG at an optional remote
	// secret's mount, absent here, and istiod's in-cluster configuration
	// at the kubelet's projected token).
	args, env, err := cp.rendered.containerSpec("Deployment", "istiod", "discovery", podFields{
		name: "istiod-lab", namespace: IstioNamespace, node: cp.Node.Name, podIP: cp.Node.IP.String(),
		hostIP: cp.Node.IP.String(), serviceAccount: istiodServiceAccount,
	})
	if err != nil {
		return err
	}
	p, err := cp.start("istiod", dir, cp.bins.Istiod(), append(args, "--kubeconfig="+kc), withEnv(env, "KUBECONFIG="+kc))
	if err != nil {
		return err
	}
	client := cp.probeClient()
	url := fmt.Sprintf("http://%s/ready", netip.AddrPortFrom(cp.Node.IP, IstiodReadyPort))
	return waitFor(ctx, p, istiodReadyTimeout, func(ctx context.Context) error {
		return probeOK(ctx, client, url, "istiod /ready")
	})
}

// probeClient is a plain-HTTP client for readiness probes inside the node;
// it keeps no connection (and so no goroutine) between probes.
func (cp *ControlPlane) probeClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{DialContext: cp.Node.Dial, DisableKeepAlives: true},
		Timeout:   5 * time.Second,
	}
}

// Kubectl runs the lab's kubectl inside the control plane's node with the
// admin kubeconfig; stdin (if not empty) is its input, as for
// `kubectl apply -f -`. It returns kubectl's standard output.
func (cp *ControlPlane) Kubectl(ctx context.Context, stdin string, args ...string) ([]byte, error) {
	return kubectl(ctx, cp.Node.NS, cp.bins.Kubectl(), cp.Kubeconfig, cp.dir("home"), stdin, args...)
}

// ServiceAccountToken returns a token of service account namespace/name for
// audiences from the TokenRequest API, bound to no object.
func (cp *ControlPlane) ServiceAccountToken(ctx context.Context, namespace, name string, audiences []string, ttl time.Duration) (string, error) {
	return cp.api.serviceAccountToken(ctx, namespace, name, audiences, ttl, nil)
}

// PodToken returns a token of the pod's service account for audiences,
// bound to the pod (namespace/pod, with its UID): what the kubelet writes
// into the pod's projected token volume.
func (cp *ControlPlane) PodToken(ctx context.Context, namespace, serviceAccount, pod, uid string, audiences []string, ttl time.Duration) (string, error) {
	return cp.api.serviceAccountToken(ctx, namespace, serviceAccount, audiences, ttl,
		&boundObjectRef{Kind: "Pod", APIVersion: "v1", Name: pod, UID: uid})
}

// IstiodAddr is istiod's xDS and CA address (TLS) on the node.
func (cp *ControlPlane) IstiodAddr() netip.AddrPort {
	return netip.AddrPortFrom(cp.Node.IP, IstiodXDSPort)
}

// Close stops the components in reverse order. Their logs stay.
func (cp *ControlPlane) Close() error {
	var errs []error
	cp.stopBg()
	cp.bgDone.Wait()
	// The nodes first: what runs on them talks to the control plane.
	cp.mu.Lock()
	for name, h := range cp.nodes {
		if err := h.close(); err != nil {
			errs = append(errs, err)
		}
		delete(cp.nodes, name)
	}
	if err := removeCgroups(cp.cgroups); err != nil {
		errs = append(errs, err)
	}
	cp.cgroups = nil
	cp.mu.Unlock()
	for i := len(cp.procs) - 1; i >= 0; i-- {
		if err := cp.procs[i].stop(stopGrace); err != nil {
			errs = append(errs, err)
		}
	}
	cp.procs = nil
	if cp.api != nil {
		cp.api.http.CloseIdleConnections()
	}
	return errors.Join(errs...)
}

// probeOK GETs url with client and wants 200; what names the probe in the
// error (the component and its path).
func probeOK(ctx context.Context, client *http.Client, url, what string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", what, resp.StatusCode)
	}
	return nil
}

// waitFor polls check until it returns nil, p exits, or timeout passes.
func waitFor(ctx context.Context, p *process, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return p.exitErr()
		case <-ctx.Done():
			return fmt.Errorf("istiolab: %s not ready after %v: %w\n%s", p.name, timeout, err, p.logTail(20))
		case <-tick.C:
		}
	}
}
