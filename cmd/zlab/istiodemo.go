package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// zlab istio demo (make demo-istio): the Istio lab's flow for a newcomer, as
// the commands they would type. It runs this binary's own `zlab istio`
// subcommands, printing each before its output: up with two nodes; the
// example's Pods applied with kubectl; a call from the client pod to the
// server pod through HBONE and the server's daemon's log line with both
// identities; an AuthorizationPolicy applied with kubectl, the call refused
// and the daemon's log line saying why; the policy deleted and the call
// passing again; down.

// istioDemoTimeout bounds each wait of the demo (a pod started, a call
// through HBONE, a policy in force); the whole demo takes under a minute
// warm.
const istioDemoTimeout = 2 * time.Minute

func istioDemo(args []string, stdout, stderr io.Writer) (err error) {
	var f istioUpFlags
	fs := f.flags("demo", stderr)
	examples := fs.String("examples", "examples/istio-demo", "the directory of pods.yaml and deny-client.yaml")
	keep := fs.Bool("keep", false, "leave the lab up afterwards (remove it with zlab istio down)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageError{fmt.Sprintf("istio demo: unexpected argument %q", fs.Arg(0))}
	}
	for _, p := range []*string{&f.bins, &f.ztunnel} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	pods, deny := filepath.Join(*examples, "pods.yaml"), filepath.Join(*examples, "deny-client.yaml")
	for _, p := range []string{pods, deny} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("istio demo: %w (run it from the repository's root, or give --examples)", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	d := &istioDemoRun{self: self, out: stdout}
	// The lab's flags, shown where they differ from the defaults, so each
	// printed command is what one would type.
	if f.prefix != defaultPrefix {
		d.flags = append(d.flags, "--prefix", f.prefix)
	}
	if f.stateDir != defaultStateDir {
		d.flags = append(d.flags, "--state-dir", f.stateDir)
	}
	upArgs := []string{"up", "--nodes", "2", "--bins", f.bins, "--ztunnel", f.ztunnel}
	if f.nftables {
		upArgs = append(upArgs, "--nftables")
	}

	d.say("the control plane (etcd, kube-apiserver, istiod: upstream programs) in node cp, and two nodes each with istio-cni's agent and the daemon")
	kubeconfig, err := d.run(upArgs...)
	if err != nil {
		return err
	}
	defer func() {
		if *keep && err == nil {
			fmt.Fprintf(stdout, "\n==> demo passed in %v; the lab stays up (kubeconfig %s): %s removes it\n",
				time.Since(start).Round(100*time.Millisecond), strings.TrimSpace(kubeconfig), d.line("down"))
			return
		}
		d.say("the lab goes")
		if _, derr := d.run("down"); derr != nil {
			err = errors.Join(err, derr)
		}
		if err == nil {
			fmt.Fprintf(stdout, "\n==> demo passed in %v\n", time.Since(start).Round(100*time.Millisecond))
		}
	}()

	d.say("a namespace labelled istio.io/dataplane-mode=ambient and two plain Pods, from " + pods)
	if _, err := d.run("kubectl", "apply", "-f", pods); err != nil {
		return err
	}
	if _, err := d.run("kubectl", "wait", "--for=condition=Ready", "pod", "--all", "-n", "demo", "--timeout=120s"); err != nil {
		return err
	}
	if _, err := d.run("kubectl", "get", "pods", "-n", "demo", "-o", "wide"); err != nil {
		return err
	}
	// istio-cni's mark on each pod it enrolled, which istiod reads.
	if _, err := d.run("kubectl", "get", "pods", "-n", "demo", "-o",
		`custom-columns=POD:.metadata.name,REDIRECTION:.metadata.annotations.ambient\.istio\.io/redirection`); err != nil {
		return err
	}
	st, err := readReadyIstioState(&f.common)
	if err != nil {
		return err
	}
	serverIP, err := d.quiet("kubectl", "get", "pod", "server", "-n", "demo", "-o", "jsonpath={.status.podIP}")
	if err != nil {
		return err
	}
	url := "http://" + strings.TrimSpace(serverIP) + ":8080/"

	// The server's app: HTTP on 8080 in the server pod's network namespace
	// (the lab's pods run no image; this process serves for it).
	ln, err := netnslab.NS{NetNS: st.Pods["demo/server"]}.Listen("tcp", "0.0.0.0:8080")
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, "hello from demo/server")
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	client := &http.Client{
		Transport: &http.Transport{DialContext: netnslab.NS{NetNS: st.Pods["demo/client"]}.Dial, DisableKeepAlives: true},
		Timeout:   5 * time.Second,
	}
	get := func() (string, error) {
		resp, err := client.Get(url)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("status %d", resp.StatusCode)
		}
		return strings.TrimSpace(string(body)), nil
	}
	inbound := []string{"connection complete", `direction="inbound"`, `src.identity="spiffe://cluster.local/ns/demo/sa/client"`,
		`dst.identity="spiffe://cluster.local/ns/demo/sa/server"`}
	denied := []string{`direction="inbound"`, "policy rejection: explicitly denied by: demo/deny-client"}

	d.say("demo/client (node1) calls demo/server (node2): istio-cni's rules send it to node1's daemon, which carries it over HBONE (mTLS, HTTP/2 CONNECT) to node2's")
	fmt.Fprintf(stdout, "  (the demo serves HTTP on 8080 in demo/server and makes the call from demo/client's network namespace,\n"+
		"   as: %s)\n", d.line("exec", "demo/client", "--", "curl", "-s", url))
	var body, line string
	if err := d.until(ctx, func() error {
		var err error
		if body, err = get(); err != nil {
			return err
		}
		if line = d.logLine("ztunnel-node2", inbound); line == "" {
			return errors.New("the call passed, but not through HBONE yet")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("the call through HBONE: %w", err)
	}
	fmt.Fprintf(stdout, "  answer: %s\n", body)
	fmt.Fprintf(stdout, "$ %s | grep 'direction=\"inbound\"'\n  %s\n", d.line("logs", "ztunnel-node2"), line)

	d.say("an AuthorizationPolicy denying the client's identity at the server, from " + deny)
	if _, err := d.run("kubectl", "apply", "-f", deny); err != nil {
		return err
	}
	var refusal error
	if err := d.until(ctx, func() error {
		if _, refusal = get(); refusal == nil {
			return errors.New("the call still passes")
		}
		if line = d.logLine("ztunnel-node2", denied); line == "" {
			return errors.New("the call failed, but the server's daemon logged no policy rejection")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("the policy: %w", err)
	}
	fmt.Fprintf(stdout, "  the call now fails: %v\n", refusal)
	fmt.Fprintf(stdout, "$ %s | grep 'policy rejection'\n  %s\n", d.line("logs", "ztunnel-node2"), line)

	d.say("the policy deleted: the call passes again")
	if _, err := d.run("kubectl", "delete", "-f", deny); err != nil {
		return err
	}
	if err := d.until(ctx, func() error {
		var err error
		body, err = get()
		return err
	}); err != nil {
		return fmt.Errorf("the call after the policy's deletion: %w", err)
	}
	fmt.Fprintf(stdout, "  answer: %s\n", body)
	return nil
}

// istioDemoRun runs the demo's zlab istio commands.
type istioDemoRun struct {
	self  string   // this binary
	flags []string // --prefix and --state-dir if not the defaults, given to each command
	out   io.Writer
}

// line is `zlab istio ARGS` as one would type it.
func (d *istioDemoRun) line(args ...string) string {
	return strings.Join(append(append([]string{"zlab", "istio", args[0]}, d.flags...), args[1:]...), " ")
}

// say prints a step's heading.
func (d *istioDemoRun) say(what string) { fmt.Fprintf(d.out, "\n==> %s\n", what) }

// run prints `zlab istio ARGS`, runs it and prints its output indented; it
// returns the output.
func (d *istioDemoRun) run(args ...string) (string, error) {
	fmt.Fprintf(d.out, "$ %s\n", d.line(args...))
	out, err := d.quiet(args...)
	for line := range strings.Lines(out) {
		fmt.Fprintf(d.out, "  %s", line)
	}
	if out != "" && !strings.HasSuffix(out, "\n") {
		fmt.Fprintln(d.out)
	}
	return out, err
}

// quiet runs `zlab istio ARGS` and returns its output.
func (d *istioDemoRun) quiet(args ...string) (string, error) {
	// The common flags after the subcommand (kubectl's own after them).
	full := append([]string{"istio", args[0]}, d.flags...)
	cmd := exec.Command(d.self, append(full, args[1:]...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("zlab istio %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// logLine returns the last line of component's log holding every part.
func (d *istioDemoRun) logLine(component string, parts []string) string {
	out, err := d.quiet("logs", component)
	if err != nil {
		return ""
	}
	var found string
	for line := range strings.Lines(out) {
		ok := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				ok = false
				break
			}
		}
		if ok {
			found = strings.TrimSpace(line)
		}
	}
	return found
}

// until polls check every half second until it passes, ctx ends or
// istioDemoTimeout passes; it returns check's last error then.
func (d *istioDemoRun) until(ctx context.Context, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, istioDemoTimeout)
	defer cancel()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (after %v)", err, istioDemoTimeout)
		case <-tick.C:
		}
	}
}
