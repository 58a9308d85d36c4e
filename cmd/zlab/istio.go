package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/istiolab"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// zlab istio: the Istio lab (docs/istio-lab.md) for an operator. `up`
// starts a supervisor (`zlab istio serve`, in the background) that owns the
// lab: the control plane, istio-cni and the daemon on each node, and the
// runtime starting the pods applied with kubectl. The other commands read
// the supervisor's state file; `down` stops it, which stops everything.

const istioUsage = `Usage:
  zlab istio up      [--nodes N] [--nftables] [--bins DIR] [--ztunnel BIN] [--prefix P]
  zlab istio kubectl [--prefix P] ARGS...
  zlab istio exec    [--prefix P] NAMESPACE/POD -- CMD [ARGS...]
  zlab istio logs    [--prefix P] COMPONENT
  zlab istio down    [--prefix P]
  zlab istio demo    [--bins DIR] [--ztunnel BIN] [--examples DIR] [--keep] [--prefix P]

  up       starts etcd, kube-apiserver and istiod (upstream, from make istio-bins) in
           node "cp", and N nodes each with istio-cni's node agent and the daemon;
           pods applied with kubectl are bound to the nodes in turn and started
           through istio-cni. Prints the admin kubeconfig's path (its server is
           reached from inside the lab: use zlab istio kubectl).
  kubectl  runs the lab's kubectl in node "cp" with the admin kubeconfig.
  exec     runs a command in a pod's network namespace.
  logs     prints a component's log (etcd, kube-apiserver, istiod,
           istio-cni-node-<node>, ztunnel-<node>, node-<node>); without one, lists them.
  down     stops the lab and removes it.
  demo     (make demo-istio) up, the Pods of examples/istio-demo/pods.yaml, a call
           through HBONE, an AuthorizationPolicy refusing it, then down: each
           command printed before its output.
`

// istioState is what the supervisor writes for the other commands.
type istioState struct {
	PID        int               `json:"pid"`
	Ready      bool              `json:"ready"`
	Error      string            `json:"error,omitempty"`
	Kubeconfig string            `json:"kubeconfig,omitempty"`
	Dir        string            `json:"dir"`
	Kubectl    string            `json:"kubectl,omitempty"`
	CPNetNS    string            `json:"cpNetns,omitempty"`
	Pods       map[string]string `json:"pods,omitempty"` // namespace/name -> network namespace
}

func (c *common) istioDir() string   { return filepath.Join(c.stateDir, c.prefix+"-istio") }
func (c *common) istioState() string { return filepath.Join(c.istioDir(), "state.json") }

func istio(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, istioUsage)
		return usageError{"istio: want a subcommand"}
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "up":
		return istioUp(rest, stdout, stderr)
	case "serve":
		return istioServe(rest, stderr)
	case "kubectl":
		return istioKubectl(rest, stdout, stderr)
	case "exec":
		return istioExec(rest, stdout, stderr)
	case "logs":
		return istioLogs(rest, stdout, stderr)
	case "down":
		return istioDown(rest, stdout, stderr)
	case "demo":
		return istioDemo(rest, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, istioUsage)
		return nil
	default:
		return usageError{fmt.Sprintf("istio: unknown command %q", cmd)}
	}
}

// istioUpFlags are up's flags, which it hands to serve as they are.
type istioUpFlags struct {
	common
	nodes    int
	nftables bool
	bins     string
	ztunnel  string
}

func (f *istioUpFlags) flags(name string, stderr io.Writer) *flag.FlagSet {
	fs := newFlags("istio "+name, stderr, &f.common)
	fs.IntVar(&f.nodes, "nodes", 2, "number of nodes")
	fs.BoolVar(&f.nftables, "nftables", false, "istio-cni's native nftables capture instead of iptables")
	fs.StringVar(&f.bins, "bins", "bin/istiolab", "the upstream programs (make istio-bins)")
	fs.StringVar(&f.ztunnel, "ztunnel", "bin/ztunnel", "the daemon")
	return fs
}

func (f *istioUpFlags) parse(name string, args []string, stderr io.Writer) error {
	if err := parse(f.flags(name, stderr), args); err != nil {
		return err
	}
	if f.nodes < 1 || f.nodes > 20 {
		return usageError{"istio " + name + ": --nodes must be 1..20"}
	}
	for _, p := range []*string{&f.bins, &f.ztunnel} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	return nil
}

// istioUpTimeout bounds up's wait for the supervisor: the control plane
// takes 10-20 s here, each node a few seconds.
const istioUpTimeout = 5 * time.Minute

func istioUp(args []string, stdout, stderr io.Writer) error {
	var f istioUpFlags
	if err := f.parse("up", args, stderr); err != nil {
		return err
	}
	if st, err := readIstioState(&f.common); err == nil && processAlive(st.PID) {
		return fmt.Errorf("the Istio lab %s is up (pid %d): zlab istio down --prefix %[1]s first", f.prefix, st.PID)
	}
	if _, err := os.Stat(f.bins); err != nil {
		return fmt.Errorf("%w (run make istio-bins)", err)
	}
	if _, err := os.Stat(f.ztunnel); err != nil {
		return fmt.Errorf("%w (run make build)", err)
	}
	if err := os.RemoveAll(f.istioDir()); err != nil {
		return err
	}
	if err := os.MkdirAll(f.istioDir(), 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logPath := filepath.Join(f.istioDir(), "serve.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	serveArgs := []string{"istio", "serve", "--prefix", f.prefix, "--state-dir", f.stateDir,
		"--nodes", fmt.Sprint(f.nodes), "--bins", f.bins, "--ztunnel", f.ztunnel}
	if f.nftables {
		serveArgs = append(serveArgs, "--nftables")
	}
	cmd := exec.Command(self, serveArgs...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: the lab outlives this command and its terminal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(istioUpTimeout)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("the lab's supervisor exited (%v); its log, %s:\n%s", err, logPath, tail(logPath, 30))
		case <-deadline:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			return fmt.Errorf("the lab was not up within %v; its log, %s:\n%s", istioUpTimeout, logPath, tail(logPath, 30))
		case <-tick.C:
		}
		st, err := readIstioState(&f.common)
		if err != nil {
			continue
		}
		if st.Error != "" {
			<-exited
			return fmt.Errorf("the lab did not come up: %s (log: %s)", st.Error, logPath)
		}
		if st.Ready {
			fmt.Fprintln(stdout, st.Kubeconfig)
			return nil
		}
	}
}

// istioServe is the supervisor: it brings the lab up, writes the state
// file, runs the pod runtime, and on SIGTERM or SIGINT takes everything down.
func istioServe(args []string, stderr io.Writer) (err error) {
	var f istioUpFlags
	if err := f.parse("serve", args, stderr); err != nil {
		return err
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(stderr, "%s "+format+"\n", append([]any{time.Now().UTC().Format(time.RFC3339)}, args...)...)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	st := &istioState{PID: os.Getpid(), Dir: filepath.Join(f.istioDir(), "lab"), Pods: map[string]string{}}
	var mu sync.Mutex // guards st
	save := func() {
		mu.Lock()
		defer mu.Unlock()
		if werr := writeJSON(f.istioState(), st); werr != nil {
			logf("writing the state: %v", werr)
		}
	}
	defer func() {
		if err != nil {
			st.Error = err.Error()
			save()
		}
	}()
	if why := netnslab.Missing(); why != "" {
		return fmt.Errorf("cannot build a lab here: %s", why)
	}
	if _, err := netnslab.CleanupStale(netnslab.GlobalPrefix); err != nil {
		logf("sweeping stale labs: %v", err)
	}
	lab, err := netnslab.NewLab(f.prefix)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, lab.Close()) }()
	cpNode, err := lab.AddNode("cp")
	if err != nil {
		return err
	}
	cp, err := istiolab.Start(ctx, istiolab.Config{Bins: f.bins, Dir: st.Dir, Node: cpNode, Logf: logf})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cp.Close()) }()
	var env []string
	if f.nftables {
		env = append(env, "NATIVE_NFTABLES=true")
	}
	cnis := map[string]*istiolab.CNI{}
	for i := range f.nodes {
		name := fmt.Sprintf("node%d", i+1)
		node, err := lab.AddNode(name)
		if err != nil {
			return err
		}
		if err := cp.RegisterNode(ctx, node); err != nil {
			return err
		}
		logf("starting istio-cni on %s", name)
		cni, err := cp.StartCNI(ctx, istiolab.CNIOptions{Node: node, Env: env})
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, cni.Stop()) }()
		zpod, err := node.AddPod("ztunnel-" + name)
		if err != nil {
			return err
		}
		logf("starting the daemon on %s", name)
		z, err := cp.StartZtunnel(ctx, istiolab.ZtunnelOptions{Binary: f.ztunnel, Pod: zpod, InpodUDS: cni.ZDSPath})
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, z.Stop()) }()
		cnis[name] = cni
	}
	mu.Lock()
	st.Ready, st.Kubeconfig, st.Kubectl, st.CPNetNS = true, cp.Kubeconfig, filepath.Join(f.bins, "kubectl"), cpNode.NetNS
	mu.Unlock()
	save()
	logf("the lab is up: kubeconfig %s", cp.Kubeconfig)
	cp.RunRuntime(ctx, istiolab.RuntimeOptions{
		CNIs: cnis,
		Logf: logf,
		Started: func(namespace, name string, pod *netnslab.Pod) {
			mu.Lock()
			st.Pods[namespace+"/"+name] = pod.NetNS
			mu.Unlock()
			save()
		},
		Stopped: func(namespace, name string) {
			mu.Lock()
			delete(st.Pods, namespace+"/"+name)
			mu.Unlock()
			save()
		},
	})
	logf("stopping")
	return nil
}

func istioKubectl(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlags("istio kubectl", stderr, &c)
	// Flags after the first argument are kubectl's.
	if err := parse(fs, args); err != nil {
		return err
	}
	st, err := readReadyIstioState(&c)
	if err != nil {
		return err
	}
	cmd := netnslab.ExecIn(context.Background(), st.CPNetNS, st.Kubectl, append([]string{"--kubeconfig", st.Kubeconfig}, fs.Args()...)...)
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(st.Dir, "home"))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	return runExit(cmd)
}

func istioExec(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlags("istio exec", stderr, &c)
	if err := parse(fs, args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" || !strings.Contains(rest[0], "/") {
		return usageError{"istio exec: want NAMESPACE/POD -- CMD [ARGS...]"}
	}
	st, err := readReadyIstioState(&c)
	if err != nil {
		return err
	}
	netns, ok := st.Pods[rest[0]]
	if !ok {
		return fmt.Errorf("no pod %s started in the Istio lab %s (is it Running? zlab istio kubectl get pods -A)", rest[0], c.prefix)
	}
	cmd := netnslab.ExecIn(context.Background(), netns, rest[2], rest[3:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	return runExit(cmd)
}

func istioLogs(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlags("istio logs", stderr, &c)
	if err := parse(fs, args); err != nil {
		return err
	}
	st, err := readIstioState(&c)
	if err != nil {
		return err
	}
	dir := filepath.Join(st.Dir, "logs")
	if fs.NArg() == 0 {
		paths, _ := filepath.Glob(filepath.Join(dir, "*.log"))
		names := []string{"serve (the supervisor: " + filepath.Join(c.istioDir(), "serve.log") + ")"}
		for _, p := range paths {
			names = append(names, strings.TrimSuffix(filepath.Base(p), ".log"))
		}
		sort.Strings(names[1:])
		fmt.Fprintln(stdout, strings.Join(names, "\n"))
		return nil
	}
	path := filepath.Join(dir, fs.Arg(0)+".log")
	if fs.Arg(0) == "serve" {
		path = filepath.Join(c.istioDir(), "serve.log")
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("no log %q (zlab istio logs lists them): %w", fs.Arg(0), err)
	}
	defer f.Close()
	_, err = io.Copy(stdout, f)
	return err
}

// istioDownTimeout bounds the supervisor's stop: each component gets 15 s
// after SIGTERM.
const istioDownTimeout = 2 * time.Minute

func istioDown(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlags("istio down", stderr, &c)
	if err := parse(fs, args); err != nil {
		return err
	}
	st, err := readIstioState(&c)
	if err != nil {
		fmt.Fprintf(stdout, "no Istio lab %s\n", c.prefix)
		return nil
	}
	if processAlive(st.PID) {
		if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
			return err
		}
		deadline := time.Now().Add(istioDownTimeout)
		for processAlive(st.PID) {
			if time.Now().After(deadline) {
				return fmt.Errorf("the lab's supervisor (pid %d) did not stop within %v", st.PID, istioDownTimeout)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// What a killed supervisor left.
	if _, err := netnslab.RemoveLab(c.prefix); err != nil && !errors.Is(err, netnslab.ErrLabBusy) {
		return err
	}
	if err := os.RemoveAll(c.istioDir()); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Istio lab %s: down\n", c.prefix)
	return nil
}

func readIstioState(c *common) (*istioState, error) {
	data, err := os.ReadFile(c.istioState())
	if err != nil {
		return nil, fmt.Errorf("no Istio lab %s (%w): run zlab istio up --prefix %[1]s", c.prefix, err)
	}
	var st istioState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", c.istioState(), err)
	}
	return &st, nil
}

func readReadyIstioState(c *common) (*istioState, error) {
	st, err := readIstioState(c)
	if err != nil {
		return nil, err
	}
	if !st.Ready || !processAlive(st.PID) {
		return nil, fmt.Errorf("the Istio lab %s is not up (see zlab istio logs serve)", c.prefix)
	}
	return st, nil
}

// processAlive reports whether pid names a live process (signal 0).
func processAlive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) == nil
}

// runExit runs cmd, carrying its exit status through run.
func runExit(cmd *exec.Cmd) error {
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return exitError{code: ee.ExitCode()}
	}
	return err
}

// writeJSON writes v to path atomically.
func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
