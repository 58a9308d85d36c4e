package istiolab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// istio-cni on a lab node: its node agent (install-cni, unmodified) as the
// istio-cni chart's DaemonSet runs it with ambient enabled, and the CNI
// plugin it installs, invoked by the lab's runtime for each new pod as a
// container runtime invokes it.

// The istio-cni chart's fixed names and ports.
const (
	// CNIServiceAccount is the node agent's service account in
	// IstioNamespace.
	CNIServiceAccount = "istio-cni"
	// CNIReadyPort serves the node agent's /readyz (the chart's readiness
	// probe), on the node's address: the lab runs the agent with the
	// chart's ambient.shareHostNetworkNamespace (hostNetwork).
	CNIReadyPort = 8000
	// primaryConflist is the node's own network configuration, which
	// istio-cni chains itself into (the chart's chained: true).
	primaryConflist = "10-istiolab.conflist"
	// primaryPlugin is the type of the lab's first plugin: the pod's veth
	// on the node's bridge and its address, which the runtime does itself
	// (netnslab) as a bridge and host-local plugin pair would.
	primaryPlugin = "istiolab-bridge"
	// cniVersion is the node's configuration's CNI version, as a current
	// runtime writes it.
	cniVersion = "1.0.0"
	// podIfName is the pod's interface (CNI_IFNAME), as kubelets name it.
	podIfName = "eth0"
	// hostNetnsDir is where the node's runtime keeps pod network
	// namespaces (CNI_NETNS), the chart's cniNetnsDir; the lab's are under
	// the host's /run/netns, which the roots mount there.
	hostNetnsDir = "/var/run/netns"
)

// cniReadyTimeout bounds the agent's start: the plugin and its
// configuration installed, the ZDS server listening.
const cniReadyTimeout = 2 * time.Minute

// CNIOptions start istio-cni's node agent on one node.
type CNIOptions struct {
	// Node is the node. Required; registered (RegisterNode) first.
	Node *netnslab.Node
	// Env adds or overrides variables after the chart's (its ConfigMap's
	// values included: NATIVE_NFTABLES=true for native nftables capture).
	Env []string
}

// CNI is istio-cni on one node: its node agent running, its plugin
// installed.
type CNI struct {
	// Node is the node.
	Node *netnslab.Node
	// ZDSPath is the node agent's ZDS socket on the host's filesystem (the
	// node's /var/run/ztunnel/ztunnel.sock): the daemon's INPOD_UDS.
	ZDSPath string

	cp   *ControlPlane
	dir  string
	host *rootfs // the node's view, where the runtime runs the plugin
	proc *process
}

// sandbox is a pod the runtime started on a node: what it stops when the
// pod is deleted. Sandboxes belong to the node (nodeHost), not to one run
// of its agent: a restarted agent's CNI stops the pods started before.
type sandbox struct {
	pod     *netnslab.Pod
	obj     PodObject
	uid     string
	proc    *podProcess
	started time.Time
}

// nodeDirs are a node's host directories, under its directory in the lab.
type nodeDirs struct{ root string }

func (d nodeDirs) cniBin() string      { return filepath.Join(d.root, "opt-cni-bin") } // /opt/cni/bin
func (d nodeDirs) cniNetD() string     { return filepath.Join(d.root, "etc-cni-net.d") }
func (d nodeDirs) istioCNI() string    { return filepath.Join(d.root, "var-run-istio-cni") }
func (d nodeDirs) ztunnel() string     { return filepath.Join(d.root, "var-run-ztunnel") }
func (d nodeDirs) saDir() string       { return filepath.Join(d.root, "agent-serviceaccount") }
func (d nodeDirs) imageBin() string    { return filepath.Join(d.root, "agent-image-opt-cni-bin") }
func (d nodeDirs) agentRoot() string   { return filepath.Join(d.root, "agent-root") }
func (d nodeDirs) hostRoot() string    { return filepath.Join(d.root, "host-root") }
func (d nodeDirs) agentBinDir() string { return "/istiolab-bin" } // inside agentRoot

// StartCNI writes the node agent's Pod object (the chart's DaemonSet pod on
// o.Node, host network), gives it its service-account token and the API
// server's CA where a pod has them, writes the node's primary CNI
// configuration, and runs install-cni with the chart's ConfigMap and
// environment for ambient, in a root of its own with the chart's host
// mounts. It returns once the agent is ready: the plugin and its chained
// configuration installed and the agent serving its plugin and ZDS sockets.
//
// Two things differ from the chart's defaults: the agent shares the node's
// network namespace (the chart's ambient.shareHostNetworkNamespace), as
// /host/proc/1 is the host's and not the lab node's; and
// KUBERNETES_SERVICE_HOST names the API server's address (no Service VIPs
// in the lab yet).
func (cp *ControlPlane) StartCNI(ctx context.Context, o CNIOptions) (c *CNI, err error) {
	if o.Node == nil {
		return nil, errors.New("istiolab: CNIOptions needs Node")
	}
	name := "istio-cni-node-" + o.Node.Name
	d := nodeDirs{root: cp.dir("node-" + o.Node.Name)}
	for _, dir := range []string{d.cniBin(), d.cniNetD(), d.istioCNI(), d.ztunnel(), d.saDir(), d.imageBin(), d.agentRoot(), d.hostRoot()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("istiolab: %w", err)
		}
	}
	// The image's /opt/cni/bin holds the plugin alone: the agent copies
	// every file there onto the node.
	if err := linkOrCopy(cp.bins.CNIPlugin(), filepath.Join(d.imageBin(), "istio-cni")); err != nil {
		return nil, err
	}
	// The node's network: what the primary CNI provider installs before
	// istio-cni, which waits for it and then chains itself in.
	primary, err := json.Marshal(map[string]any{
		"cniVersion": cniVersion, "name": "istiolab",
		"plugins": []map[string]any{{"type": primaryPlugin}},
	})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(d.cniNetD(), primaryConflist), primary, 0o644); err != nil {
		return nil, fmt.Errorf("istiolab: %w", err)
	}

	// The DaemonSet's pod template's labels and annotations.
	labels, annotations, err := cp.rendered.podMeta("DaemonSet", "istio-cni-node")
	if err != nil {
		return nil, err
	}
	uid, err := cp.WritePod(ctx, PodObject{
		Namespace: IstioNamespace, Name: name, ServiceAccount: CNIServiceAccount,
		Node: o.Node, IP: o.Node.IP, HostNetwork: true, Container: "install-cni",
		Labels: labels, Annotations: annotations,
	})
	if err != nil {
		return nil, err
	}
	// The kubelet's projected service-account volume (kube-api-access): a
	// token bound to the pod for the API server's audience, renewed at 80%
	// of its lifetime while the agent runs, its CA and the namespace.
	gone := make(chan struct{})
	var proc *process
	defer func() {
		if proc == nil {
			close(gone)
		}
	}()
	if err := cp.mountToken(ctx, tokenVolume{
		dir: d.saDir(),
		files: func(token string) map[string][]byte {
			return map[string][]byte{"token": []byte(token), "ca.crt": cp.CAPEM, "namespace": []byte(IstioNamespace)}
		},
		namespace: IstioNamespace, serviceAccount: CNIServiceAccount, ttl: projectedTokenTTL,
		bound: &boundObjectRef{Kind: "Pod", APIVersion: "v1", Name: name, UID: uid}, until: gone,
	}); err != nil {
		return nil, err
	}

	// The agent container's mounts (the chart's volumeMounts with ambient
	// enabled), over the host's system directories.
	// The node's PID namespace, whose /proc the agent sees on /proc and
	// /host/proc.
	h, err := cp.nodeHost(o.Node)
	if err != nil {
		return nil, err
	}
	agent := &rootfs{Dir: d.agentRoot(), Procs: []string{"/proc", "/host/proc"}, Mounts: append(systemMounts(),
		bindMount{Src: d.cniBin(), Dst: "/host/opt/cni/bin"},
		bindMount{Src: d.cniNetD(), Dst: "/host/etc/cni/net.d"},
		bindMount{Src: d.istioCNI(), Dst: "/var/run/istio-cni"},
		bindMount{Src: "/run/netns", Dst: "/host" + hostNetnsDir},
		bindMount{Src: d.ztunnel(), Dst: "/var/run/ztunnel"},
		bindMount{Src: d.saDir(), Dst: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
		// The image's files: the plugin to install, and the agent itself.
		bindMount{Src: d.imageBin(), Dst: "/opt/cni/bin", ReadOnly: true},
		bindMount{Src: cp.bins.Dir, Dst: d.agentBinDir(), ReadOnly: true},
	)}
	if err := agent.prepare(); err != nil {
		return nil, err
	}
	// The node's own view, where the runtime runs the plugin: its CNI
	// directories and /var/run/istio-cni (the plugin's kubeconfig and the
	// agent's sockets).
	host := &rootfs{Dir: d.hostRoot(), Mounts: []bindMount{
		{Src: "/dev", Dst: "/dev"},
		{Src: "/proc", Dst: "/proc"},
		{Src: d.cniBin(), Dst: "/opt/cni/bin", ReadOnly: true},
		{Src: d.cniNetD(), Dst: "/etc/cni/net.d", ReadOnly: true},
		{Src: d.istioCNI(), Dst: "/var/run/istio-cni"},
		{Src: "/run/netns", Dst: hostNetnsDir},
	}}
	if err := host.prepare(); err != nil {
		return nil, err
	}

	// The rendered DaemonSet's container as a kubelet starts it in this
	// node's pod: its ConfigMap (envFrom istio-cni-config) and env with the
	// Downward API resolved. The lab's overrides: the image's PATH and HOME,
	// and what a kubelet gives every pod, the API server's address (the
	// lab's difference, see above).
	args, env, err := cp.rendered.containerSpec("DaemonSet", "istio-cni-node", "install-cni", podFields{
		name: name, namespace: IstioNamespace, node: o.Node.Name, podIP: o.Node.IP.String(),
		hostIP: o.Node.IP.String(), serviceAccount: CNIServiceAccount,
	})
	if err != nil {
		return nil, err
	}
	env = withEnv(env,
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/cni/bin",
		"HOME=/",
		"KUBERNETES_SERVICE_HOST="+cp.Node.IP.String(),
		"KUBERNETES_SERVICE_PORT="+strconv.Itoa(APIServerPort),
	)
	cmd := agent.command(context.Background(), o.Node.NS, h.enter, d.agentBinDir()+"/install-cni", args...)
	cmd.Env = withEnv(env, o.Env...)
	proc, err = startCmd(name, cp.logDir, cmd)
	if err != nil {
		return nil, err
	}
	proc.inChild = true // nsenter's child
	cp.bgDone.Go(func() {
		select {
		case <-proc.exited:
		case <-cp.bg.Done():
		}
		close(gone)
	})
	c = &CNI{Node: o.Node, ZDSPath: filepath.Join(d.ztunnel(), "ztunnel.sock"), cp: cp, dir: d.root, host: host, proc: proc}
	defer func() {
		if err != nil {
			_ = proc.stop(stopGrace)
		}
	}()
	client := &http.Client{
		Transport: &http.Transport{DialContext: o.Node.Dial, DisableKeepAlives: true},
		Timeout:   5 * time.Second,
	}
	url := fmt.Sprintf("http://%s/readyz", netip.AddrPortFrom(o.Node.IP, CNIReadyPort))
	err = waitFor(ctx, proc, cniReadyTimeout, func(ctx context.Context) error {
		if err := probeOK(ctx, client, url, name+" /readyz"); err != nil {
			return err
		}
		if _, err := c.pluginConfig(); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Stop ends the node agent (SIGTERM: it removes its plugin and
// configuration unless it sees an upgrade, as in a DaemonSet rollout).
func (c *CNI) Stop() error { return c.proc.stop(stopGrace) }

// LogPath returns the node agent's log file.
func (c *CNI) LogPath() string { return c.proc.logPath }

// pluginConfig reads the node's CNI configuration list as istio-cni left
// it and returns istio-cni's entry, which must follow the lab's own.
func (c *CNI) pluginConfig() (map[string]any, error) {
	data, err := os.ReadFile(filepath.Join(nodeDirs{root: c.dir}.cniNetD(), primaryConflist))
	if err != nil {
		return nil, fmt.Errorf("istiolab: %w", err)
	}
	var list struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("istiolab: %s: %w", primaryConflist, err)
	}
	if len(list.Plugins) != 2 || list.Plugins[0]["type"] != primaryPlugin || list.Plugins[1]["type"] != "istio-cni" {
		return nil, fmt.Errorf("istiolab: istio-cni has not chained itself into %s: %s", primaryConflist, data)
	}
	conf := list.Plugins[1]
	// A runtime hands each plugin the list's name and version.
	conf["cniVersion"], conf["name"] = list.CNIVersion, list.Name
	return conf, nil
}

// PodSpec is a pod the runtime starts on a node with istio-cni.
type PodSpec struct {
	// Namespace and Name name the Pod.
	Namespace, Name string
	// ServiceAccount is spec.serviceAccountName.
	ServiceAccount string
	// Labels and Annotations are the Pod's.
	Labels, Annotations map[string]string
}

// RunPod starts a pod on the node as a kubelet and container runtime do: the
// Pod object bound to the node; its sandbox (a network namespace on the
// node's bridge with its address: the lab's primary plugin, netnslab); the
// chained plugins run with CNI ADD, istio-cni's with the previous result,
// CNI_NETNS, CNI_CONTAINERID, CNI_IFNAME and the K8S_POD_* arguments, so
// istio-cni's agent writes the pod's capture rules and hands it to the
// node's ztunnel when the pod is in the mesh; then the pod's status, Running
// with its IP. It returns the pod's namespace and UID.
func (c *CNI) RunPod(ctx context.Context, spec PodSpec) (*netnslab.Pod, string, error) {
	pod, err := c.Node.AddPod(spec.Name)
	if err != nil {
		return nil, "", err
	}
	obj := PodObject{
		Namespace: spec.Namespace, Name: spec.Name, ServiceAccount: spec.ServiceAccount,
		Node: c.Node, IP: pod.IP, Labels: spec.Labels, Annotations: spec.Annotations,
	}
	uid, err := c.cp.CreatePod(ctx, obj)
	if err != nil {
		return nil, "", err
	}
	if err := c.sandbox(ctx, pod, obj, uid); err != nil {
		return nil, "", err
	}
	return pod, uid, nil
}

// sandbox does a runtime's part for a pod whose object exists and whose
// network namespace the lab made: the sandbox's process (before its
// network is set up, as a runtime starts its pause container), istio-cni's
// plugin, then the pod's status, Running.
func (c *CNI) sandbox(ctx context.Context, pod *netnslab.Pod, obj PodObject, uid string) error {
	h, err := c.cp.nodeHost(c.Node)
	if err != nil {
		return err
	}
	started := time.Now()
	pp, err := h.startPod(c.cp, pod, uid, containerID(uid))
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.sandboxes[uid] = &sandbox{pod: pod, obj: obj, uid: uid, proc: pp, started: started}
	h.mu.Unlock()
	if err := c.cniRun(ctx, "ADD", pod, obj.Namespace, obj.Name, uid); err != nil {
		return err
	}
	return c.cp.WritePodRunning(ctx, obj)
}

// sandboxOf returns the sandbox of the pod with uid, if it was started
// on this node.
func (c *CNI) sandboxOf(uid string) (*sandbox, bool) {
	h, err := c.cp.nodeHost(c.Node)
	if err != nil {
		return nil, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sandboxes[uid]
	return s, ok
}

// sandboxList returns the node's sandboxes.
func (c *CNI) sandboxList() []*sandbox {
	h, err := c.cp.nodeHost(c.Node)
	if err != nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	list := make([]*sandbox, 0, len(h.sandboxes))
	for _, s := range h.sandboxes {
		list = append(list, s)
	}
	return list
}

// stopSandbox stops a pod's sandbox as a kubelet does once the pod is
// deleted (its containers' grace period over): CNI DEL of the chained
// plugins with the result of their ADD, the pod's process killed and its
// cgroups removed, its network namespace deleted. The Pod object stays:
// the kubelet's final delete is the caller's.
func (c *CNI) stopSandbox(ctx context.Context, s *sandbox) error {
	h, err := c.cp.nodeHost(c.Node)
	if err != nil {
		return err
	}
	h.mu.Lock()
	delete(h.sandboxes, s.uid)
	h.mu.Unlock()
	var errs []error
	if err := c.cniRun(ctx, "DEL", s.pod, s.obj.Namespace, s.obj.Name, s.uid); err != nil {
		errs = append(errs, err)
	}
	if err := h.stopPod(s.proc); err != nil {
		errs = append(errs, err)
	}
	if err := s.pod.Delete(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// cniResult is a CNI 1.0 result, the fields the lab's primary plugin fills.
type cniResult struct {
	CNIVersion string `json:"cniVersion"`
	Interfaces []struct {
		Name    string `json:"name"`
		Sandbox string `json:"sandbox,omitempty"`
	} `json:"interfaces"`
	IPs []struct {
		Address   string `json:"address"`
		Gateway   string `json:"gateway,omitempty"`
		Interface *int   `json:"interface,omitempty"`
	} `json:"ips"`
	Routes []struct {
		Dst string `json:"dst"`
		GW  string `json:"gw,omitempty"`
	} `json:"routes,omitempty"`
}

// primaryResult is what the lab's primary plugin (netnslab's AddPod) did,
// as a bridge and host-local pair reports it: the pod's interface, its
// address and gateway, its default route.
func primaryResult(pod *netnslab.Pod, netnsPath string) cniResult {
	var r cniResult
	r.CNIVersion = cniVersion
	r.Interfaces = append(r.Interfaces, struct {
		Name    string `json:"name"`
		Sandbox string `json:"sandbox,omitempty"`
	}{Name: podIfName, Sandbox: netnsPath})
	zero := 0
	r.IPs = append(r.IPs, struct {
		Address   string `json:"address"`
		Gateway   string `json:"gateway,omitempty"`
		Interface *int   `json:"interface,omitempty"`
	}{Address: netip.PrefixFrom(pod.IP, pod.Node.PodCIDR.Bits()).String(), Gateway: pod.Node.Gateway().String(), Interface: &zero})
	r.Routes = append(r.Routes, struct {
		Dst string `json:"dst"`
		GW  string `json:"gw,omitempty"`
	}{Dst: "0.0.0.0/0", GW: pod.Node.Gateway().String()})
	return r
}

// cniRun runs the chain's plugins after the primary one (whose ADD AddPod
// did, and whose DEL the pod's namespace going does) with CNI command ADD or
// DEL, as a runtime (libcni) does: with the previous result, which on DEL
// is the cached result of the pod's ADD.
func (c *CNI) cniRun(ctx context.Context, command string, pod *netnslab.Pod, namespace, name, uid string) error {
	conf, err := c.pluginConfig()
	if err != nil {
		return err
	}
	netnsPath := hostNetnsDir + "/" + pod.NetNS
	conf["prevResult"] = primaryResult(pod, netnsPath)
	stdin, err := json.Marshal(conf)
	if err != nil {
		return err
	}
	cid := containerID(uid)
	cmd := c.host.command(ctx, c.Node.NS, nil, "/opt/cni/bin/istio-cni")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), // unshare's and chroot's; the plugin runs no program
		"CNI_COMMAND=" + command,
		"CNI_CONTAINERID=" + cid,
		"CNI_NETNS=" + netnsPath,
		"CNI_IFNAME=" + podIfName,
		"CNI_PATH=/opt/cni/bin",
		"CNI_ARGS=" + strings.Join([]string{
			"IgnoreUnknown=1",
			"K8S_POD_NAMESPACE=" + namespace,
			"K8S_POD_NAME=" + name,
			"K8S_POD_INFRA_CONTAINER_ID=" + cid,
			"K8S_POD_UID=" + uid,
		}, ";"),
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("istiolab: istio-cni %s for %s/%s: %w: %s %s", command, namespace, name, err,
			strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()))
	}
	// On ADD the plugin answers the previous result (a chained plugin
	// changes no interface); on DEL nothing. An error answer is a JSON
	// object with a code.
	if command == "DEL" && len(bytes.TrimSpace(stdout.Bytes())) == 0 {
		return nil
	}
	var answer struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &answer); err != nil {
		return fmt.Errorf("istiolab: istio-cni %s answered %q: %w", command, stdout.String(), err)
	}
	if answer.Code != 0 {
		return fmt.Errorf("istiolab: istio-cni %s: code %d: %s", command, answer.Code, answer.Msg)
	}
	return nil
}

// containerID is the pod's sandbox ID: a runtime's is a 64-hex container
// ID; the pod's UID without dashes is as unique.
func containerID(uid string) string { return strings.ReplaceAll(uid, "-", "") }

// linkOrCopy makes dst the file src: a hard link where both are on one
// filesystem, else a copy.
func linkOrCopy(src, dst string) error {
	_ = os.Remove(dst)
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("istiolab: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return fmt.Errorf("istiolab: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("istiolab: %w", err)
	}
	return out.Close()
}
