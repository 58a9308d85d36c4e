package netnslab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// cmdTimeout bounds every command the lab runs: a wedged `ip` or iptables must fail
// the test, not hang it.
const cmdTimeout = 30 * time.Second

// run runs a command and returns its output in the error. stdin may be empty.
func run(logf func(string, ...any), stdin, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	line := name + " " + strings.Join(args, " ")
	if stdin != "" {
		logf("netnslab: %s <<EOF\n%sEOF", line, stdin)
	} else {
		logf("netnslab: %s", line)
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("netnslab: %s: %w: %s", line, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// ipBatch runs `ip` commands inside the named namespace in one process. It refuses an
// empty namespace, which would configure the root namespace.
func ipBatch(logf func(string, ...any), netnsName string, cmds ...string) error {
	if netnsName == "" {
		return ErrNoNetNS
	}
	return run(logf, strings.Join(cmds, "\n")+"\n", "ip", "-n", netnsName, "-batch", "-")
}

// ipBatch6 is ipBatch for IPv6 (`ip -6`: a batch line cannot take the
// family option itself).
func ipBatch6(logf func(string, ...any), netnsName string, cmds ...string) error {
	if netnsName == "" {
		return ErrNoNetNS
	}
	return run(logf, strings.Join(cmds, "\n")+"\n", "ip", "-6", "-n", netnsName, "-batch", "-")
}

// writeSysctls writes /proc/sys entries. Called inside Do: /proc/sys/net resolves to
// the network namespace of the calling thread.
func writeSysctls(kv map[string]string) error {
	for k, v := range kv {
		if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0); err != nil {
			return fmt.Errorf("netnslab: sysctl %s=%s: %w", k, v, err)
		}
	}
	return nil
}

// removeNamespaces deletes the named namespaces that exist, in order.
func removeNamespaces(logf func(string, ...any), names []string) error {
	var cmds []string
	for _, n := range names {
		if n == "" || strings.ContainsAny(n, "/\n") {
			continue
		}
		if _, err := os.Lstat(filepath.Join(netnsDir, n)); err == nil {
			cmds = append(cmds, "netns del "+n)
		}
	}
	if len(cmds) == 0 {
		return nil
	}
	// -force: keep deleting after a failure; the error still reports it.
	return run(logf, strings.Join(cmds, "\n")+"\n", "ip", "-force", "-batch", "-")
}

// listNamespaces returns the names of all named network namespaces.
func listNamespaces() ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netnslab: list namespaces: %w", err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}

// labOf returns the lab prefix of a namespace name: the part before the first "_".
func labOf(netnsName string) string {
	lab, _, _ := strings.Cut(netnsName, "_")
	return lab
}

// labNamespaces lists the existing namespaces of one lab.
func labNamespaces(prefix string) []string {
	all, _ := listNamespaces()
	var mine []string
	for _, n := range all {
		if labOf(n) == prefix {
			mine = append(mine, n)
		}
	}
	// Delete the node network last so nodes and pods go first.
	for i, n := range mine {
		if n == prefix {
			mine = append(append(mine[:i:i], mine[i+1:]...), n)
			break
		}
	}
	return mine
}
