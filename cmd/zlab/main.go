// Command zlab creates, inspects and removes network-namespace labs (simulated
// Kubernetes nodes and pods, see internal/netnslab) for humans and scripts.
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
	"path/filepath"
	"text/tabwriter"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

const (
	defaultPrefix   = "zl-demo"
	defaultStateDir = "/run/zlab"
)

const usage = `zlab builds simulated Kubernetes nodes and pods as Linux network namespaces.

Usage:
  zlab up   [--nodes N] [--pods N] [--capture] [--capture-dns] [--prefix P] [--json] [-v]
  zlab show [--prefix P] [--json]
  zlab exec [--prefix P] <pod-or-node> -- <command> [args...]
  zlab down [--prefix P]
  zlab demo [--ztunnel bin/ztunnel] [--config examples/demo.yaml] [--transfer-mib N] [--keep]
  zlab istio up|kubectl|exec|logs|down|demo ...   (zlab istio help; docs/istio-lab.md)

  up    creates N nodes with N pods each and leaves them up (nodes node<i>, pods
        pod<i>-<j>; node i is 172.30.0.<i+1>, its pods 10.244.<i>.<j+2>).
        --capture installs Istio's in-pod capture rules in every pod
        (TCP out -> 15001, in -> 15006 except 15008, mark 1337 bypasses).
  show  prints the lab's topology.
  exec  runs a command inside a pod's or node's network namespace.
  demo  builds the mesh of a ztunnel config (one pod per workload, a ztunnel
        in each HBONE pod), sends traffic across nodes through HBONE, shows the
        policies refusing what they should, prints a summary and tears down.
  istio the Istio lab: upstream Kubernetes, istiod and istio-cni around the
        daemon on each node (make istio-bins first).
  down  removes the lab, and the leftovers of crashed labs ("zl-" namespaces
        whose owner died). Removing a lab that does not exist is not an error.

Flags after the subcommand; flags must precede <pod-or-node>. The prefix (default
zl-demo) must match ^zl-[a-z0-9-]{1,24}$; the topology is stored in
/run/zlab/<prefix>.json. Needs root, iproute2 and iptables.

Examples:
  zlab up --nodes 2 --pods 2 --capture
  zlab exec pod0-0 -- ip -4 addr
  zlab exec pod1-1 -- ping -c1 10.244.0.2      # needs iputils-ping
  zlab exec node0 -- ip route
  zlab up --prefix zl-bench --nodes 3 --pods 1 --json > lab.json
  zlab down --prefix zl-bench
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// exitError carries a command's exit status through run.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// run executes one zlab invocation and returns its exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "up":
		err = up(rest, stdout, stderr)
	case "show":
		err = show(rest, stdout, stderr)
	case "exec":
		err = execIn(rest, stdout, stderr)
	case "down":
		err = down(rest, stdout, stderr)
	case "demo":
		err = demo(rest, stdout, stderr)
	case "istio":
		err = istio(rest, stdout, stderr)
	default:
		err = usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
	var ee exitError
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "zlab: %v\nRun 'zlab help' for usage.\n", err)
		return 2
	case errors.Is(err, flag.ErrHelp):
		return 0
	default:
		fmt.Fprintf(stderr, "zlab: %v\n", err)
		return 1
	}
}

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// common holds the flags every subcommand takes.
type common struct {
	prefix   string
	stateDir string
}

func newFlags(name string, stderr io.Writer, c *common) *flag.FlagSet {
	fs := flag.NewFlagSet("zlab "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.prefix, "prefix", defaultPrefix, "lab prefix (starts every namespace name)")
	fs.StringVar(&c.stateDir, "state-dir", defaultStateDir, "where topology files are kept")
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	return nil
}

func (c *common) statePath() string { return filepath.Join(c.stateDir, c.prefix+".json") }

func up(args []string, stdout, stderr io.Writer) (err error) {
	var c common
	fs := newFlags("up", stderr, &c)
	nodes := fs.Int("nodes", 2, "number of nodes")
	pods := fs.Int("pods", 2, "pods per node")
	capture := fs.Bool("capture", false, "install the in-pod capture rules in every pod")
	captureDNS := fs.Bool("capture-dns", false, "with --capture, also redirect DNS (port 53) to 15053")
	asJSON := fs.Bool("json", false, "print the topology as JSON")
	verbose := fs.Bool("v", false, "print every command run")
	if err := parse(fs, args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return usageError{fmt.Sprintf("up: unexpected argument %q", fs.Arg(0))}
	case *nodes < 1 || *nodes > 250:
		return usageError{"up: --nodes must be 1..250"}
	case *pods < 0 || *pods > 250:
		return usageError{"up: --pods must be 0..250"}
	case *captureDNS && !*capture:
		return usageError{"up: --capture-dns needs --capture"}
	}
	if why := netnslab.Missing(); why != "" {
		return fmt.Errorf("cannot build a lab here: %s", why)
	}
	if _, err := netnslab.CleanupStale(netnslab.GlobalPrefix); err != nil {
		fmt.Fprintf(stderr, "zlab: warning: sweeping stale labs: %v\n", err)
	}
	cfg := netnslab.Config{Prefix: c.prefix}
	if *verbose {
		cfg.Logf = func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }
	}
	lab, err := netnslab.NewLabWith(cfg)
	if errors.Is(err, netnslab.ErrLabDetached) {
		return fmt.Errorf("lab %s is already up: see `zlab show --prefix %[1]s`, or `zlab down --prefix %[1]s` first", c.prefix)
	}
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, lab.Close())
		}
	}()
	for i := range *nodes {
		n, err := lab.AddNode(fmt.Sprintf("node%d", i))
		if err != nil {
			return err
		}
		for j := range *pods {
			p, err := n.AddPod(fmt.Sprintf("pod%d-%d", i, j))
			if err != nil {
				return err
			}
			if *capture {
				if err := p.InstallCaptureWith(netnslab.CaptureOptions{RedirectDNS: *captureDNS}); err != nil {
					return err
				}
			}
		}
	}
	topo := lab.Topology()
	if err := writeState(c.statePath(), topo); err != nil {
		return err
	}
	if err := lab.Detach(); err != nil {
		os.Remove(c.statePath())
		return err
	}
	if *asJSON {
		return printJSON(stdout, topo)
	}
	printTable(stdout, topo)
	fmt.Fprintf(stdout, "\nTry: zlab exec --prefix %s %s -- ip addr\nRemove with: zlab down --prefix %[1]s\n",
		c.prefix, firstName(topo))
	return nil
}

func firstName(t *netnslab.Topology) string {
	if pods := t.Pods(); len(pods) > 0 {
		return pods[0].Name
	}
	return t.Nodes[0].Name
}

func show(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlags("show", stderr, &c)
	asJSON := fs.Bool("json", false, "print the topology as JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("show: unexpected argument %q", fs.Arg(0))}
	}
	topo, err := readState(&c)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, topo)
	}
	printTable(stdout, topo)
	return nil
}

func execIn(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlags("exec", stderr, &c)
	if err := parse(fs, args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" {
		return usageError{"exec: want <pod-or-node> -- <command> [args...]"}
	}
	topo, err := readState(&c)
	if err != nil {
		return err
	}
	ns, ok := topo.Lookup(rest[0])
	if !ok {
		return fmt.Errorf("no pod or node %q in lab %s", rest[0], c.prefix)
	}
	cmd := ns.Command(context.Background(), rest[2], rest[3:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return exitError{code: ee.ExitCode()}
	}
	return err
}

func down(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlags("down", stderr, &c)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("down: unexpected argument %q", fs.Arg(0))}
	}
	removed, err := netnslab.RemoveLab(c.prefix)
	if errors.Is(err, netnslab.ErrLabBusy) {
		return fmt.Errorf("lab %s is owned by a running process (a test or demo); stop it instead", c.prefix)
	}
	if err != nil {
		return err
	}
	if err := os.Remove(c.statePath()); err != nil && !os.IsNotExist(err) {
		return err
	}
	stale, err := netnslab.CleanupStale(netnslab.GlobalPrefix)
	fmt.Fprintf(stdout, "lab %s: removed %d namespaces; stale leftovers removed: %d\n", c.prefix, len(removed), len(stale))
	return err
}

func readState(c *common) (*netnslab.Topology, error) {
	data, err := os.ReadFile(c.statePath())
	if os.IsNotExist(err) {
		return nil, fmt.Errorf("no lab %s (no %s): run `zlab up --prefix %[1]s`", c.prefix, c.statePath())
	}
	if err != nil {
		return nil, err
	}
	return netnslab.ParseTopology(data)
}

// writeState writes the topology atomically, so a reader never sees half a file.
func writeState(path string, t *netnslab.Topology) error {
	data, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func printJSON(w io.Writer, t *netnslab.Topology) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(t)
}

func printTable(w io.Writer, t *netnslab.Topology) {
	fmt.Fprintf(w, "lab %s: node network %s (bridge in netns %s)\n", t.Prefix, t.NodeNetwork, t.NetNS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tIP\tPOD CIDR / NODE\tNETNS\tCAPTURE")
	for _, n := range t.Nodes {
		fmt.Fprintf(tw, "node\t%s\t%s\t%s\t%s\t\n", n.Name, n.IP, n.PodCIDR, n.NetNS)
		for _, p := range n.Pods {
			capture := "-"
			if p.Captured {
				capture = "in-pod"
			}
			fmt.Fprintf(tw, "pod\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.IP, n.Name, p.NetNS, capture)
		}
	}
	tw.Flush()
}
