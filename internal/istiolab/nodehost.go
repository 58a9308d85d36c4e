package istiolab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// A node's processes. A lab node is a network namespace; for istio-cni it
// must also be a PID namespace: the agent reads the node's /proc (mounted on
// /host/proc) to tell the node's network namespace (that of PID 1) from
// pods', to find the kubelet (native nftables mode matches its health
// probes by its UID), and, after a restart, to find each existing pod's
// network namespace through a process of the pod in a cgroup named after
// the pod's UID (cni/pkg/nodeagent/podcgroupns*.go). So each node gets a PID
// namespace whose first process is a kubelet stand-in in the node's network
// namespace, the agent runs in it, and each pod started by the runtime has a
// process in it (a pause stand-in, as a runtime's sandbox has) in the pod's
// network namespace and in a cgroup kubepods/pod<UID>/<container ID>.

// nodeHost is one node's PID namespace and the processes the lab runs in it.
type nodeHost struct {
	node    *netnslab.Node
	dirs    nodeDirs
	init    *process // unshare, whose child is the namespace's first process
	initPID int      // that child's PID on the host

	mu        sync.Mutex // guards the following fields
	pods      []*process
	cgroups   []string            // the pods' own
	sandboxes map[string]*sandbox // the pods started on the node, by UID
}

// nodeInitTimeout bounds the wait for a node's first process.
const nodeInitTimeout = 10 * time.Second

// nodeHost returns node's PID namespace, starting it on first use.
func (cp *ControlPlane) nodeHost(node *netnslab.Node) (*nodeHost, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if h, ok := cp.nodes[node.Name]; ok {
		return h, nil
	}
	d := nodeDirs{root: cp.dir("node-" + node.Name)}
	if err := os.MkdirAll(d.root, 0o755); err != nil {
		return nil, fmt.Errorf("istiolab: %w", err)
	}
	// The stand-ins are sleep under the names the agent looks for: a
	// process's name (comm) is its executable's file name, a link's own.
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		return nil, fmt.Errorf("istiolab: %w", err)
	}
	if sleep, err = filepath.EvalSymlinks(sleep); err != nil {
		return nil, fmt.Errorf("istiolab: %w", err)
	}
	for _, name := range []string{"kubelet", "pause"} {
		link := filepath.Join(d.root, name)
		_ = os.Remove(link)
		if err := os.Symlink(sleep, link); err != nil {
			return nil, fmt.Errorf("istiolab: %w", err)
		}
	}
	// --kill-child: the namespace, and every process in it, ends with
	// unshare (whose parent's death kills it).
	cmd := node.Command(context.Background(), "unshare", "--pid", "--fork", "--kill-child=SIGKILL", "--",
		filepath.Join(d.root, "kubelet"), "infinity")
	p, err := startCmd("node-"+node.Name, cp.logDir, cmd)
	if err != nil {
		return nil, err
	}
	// The first process ignores SIGTERM (PID 1 has no default action).
	p.inChild, p.stopSignal = true, syscall.SIGKILL
	h := &nodeHost{node: node, dirs: d, init: p, sandboxes: make(map[string]*sandbox)}
	deadline := time.Now().Add(nodeInitTimeout)
	for {
		if pid, ok := firstChild(p.cmd.Process.Pid); ok {
			h.initPID = pid
			break
		}
		select {
		case <-p.exited:
			return nil, p.exitErr()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = p.stop(stopGrace)
			return nil, fmt.Errorf("istiolab: node %s: no first process within %v", node.Name, nodeInitTimeout)
		}
	}
	cp.nodes[node.Name] = h
	return h, nil
}

// enter prefixes a command's argv so that it runs in the node's PID
// namespace (nsenter forks: the program is nsenter's child).
func (h *nodeHost) enter(argv ...string) []string {
	return append([]string{"nsenter", "--target", strconv.Itoa(h.initPID), "--pid", "--"}, argv...)
}

// cgroupBase is the hierarchy pod cgroups are made in: the unified one on
// a cgroup v2 host, else v1's pids hierarchy.
func cgroupBase() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "/sys/fs/cgroup"
	}
	return "/sys/fs/cgroup/pids"
}

// startPod starts the pod's process: in the pod's network namespace, the
// node's PID namespace and the cgroup a kubelet's runtime gives a pod's
// container (…/kubepods/besteffort/pod<UID>/<container ID>, under a cgroup
// of the lab's own).
func (h *nodeHost) startPod(cp *ControlPlane, pod *netnslab.Pod, uid, containerID string) (*podProcess, error) {
	lab, _, _ := strings.Cut(pod.NetNS, "_")
	top := filepath.Join(cgroupBase(), "istiolab-"+lab)
	shared := filepath.Join(top, "kubepods", "besteffort")
	podDir := filepath.Join(shared, "pod"+uid)
	leaf := filepath.Join(podDir, containerID)
	// The pod's own cgroups go with the node (or with the pod, stopped
	// first); the lab's, which the nodes share, with the control plane.
	pp := &podProcess{cgroups: []string{leaf, podDir}}
	h.mu.Lock()
	h.cgroups = append(h.cgroups, pp.cgroups...)
	h.mu.Unlock()
	cp.mu.Lock()
	for _, dir := range []string{shared, filepath.Dir(shared), top} {
		if !slices.Contains(cp.cgroups, dir) {
			cp.cgroups = append(cp.cgroups, dir)
		}
	}
	cp.mu.Unlock()
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		return nil, fmt.Errorf("istiolab: pod cgroup: %w", err)
	}
	argv := append([]string{"ip", "netns", "exec", pod.NetNS}, h.enter(filepath.Join(h.dirs.root, "pause"), "infinity")...)
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = shellQuote(a)
	}
	// The shell joins the cgroup before it becomes the command, so that
	// every process after it is born there.
	script := fmt.Sprintf("echo $$ >%s && exec %s", shellQuote(filepath.Join(leaf, "cgroup.procs")), strings.Join(quoted, " "))
	p, err := startCmd("pod-"+pod.Name, cp.logDir, exec.Command("sh", "-c", script))
	if err != nil {
		return nil, err
	}
	p.inChild, p.stopSignal = true, syscall.SIGKILL
	pp.proc = p
	h.mu.Lock()
	h.pods = append(h.pods, p)
	h.mu.Unlock()
	return pp, nil
}

// podProcess is a pod's process and its cgroups.
type podProcess struct {
	proc    *process
	cgroups []string // leaf first
}

// stopPod ends a pod's process and removes its cgroups, as a runtime
// removes a stopped sandbox; the node forgets them.
func (h *nodeHost) stopPod(pp *podProcess) error {
	err := pp.proc.stop(stopGrace)
	h.mu.Lock()
	h.pods = slices.DeleteFunc(h.pods, func(p *process) bool { return p == pp.proc })
	h.cgroups = slices.DeleteFunc(h.cgroups, func(dir string) bool { return slices.Contains(pp.cgroups, dir) })
	h.mu.Unlock()
	// The process is gone once stop returns, but the kernel may take a
	// moment to leave its cgroup; rmdir fails with EBUSY until then.
	var rmErr error
	for range 50 {
		if rmErr = removeCgroups(pp.cgroups); rmErr == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.Join(err, rmErr)
}

// close ends the node's PID namespace (and so every process in it: the
// stand-ins, pods' processes, an agent still running) and removes the
// pods' cgroups.
func (h *nodeHost) close() error {
	var errs []error
	if err := h.init.stop(stopGrace); err != nil {
		errs = append(errs, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.pods {
		if err := p.stop(stopGrace); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, removeCgroups(h.cgroups))...)
}

// removeCgroups removes cgroup directories, deepest first: a cgroup goes
// only once empty of processes and children.
func removeCgroups(dirs []string) error {
	dirs = slices.Clone(dirs)
	slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, dir := range dirs {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("istiolab: %w", err))
		}
	}
	return errors.Join(errs...)
}
