package istiolab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Istioctl is Istio's operator CLI, built from the same Istio as istiod. It is
// not among the programs New checks for, as only the istioctl test and
// operators use it.
func (b Bins) Istioctl() string { return filepath.Join(b.Dir, "istioctl") }

// Istioctl runs istioctl in the control plane's node, where the API server
// is reached, with the admin kubeconfig, as an operator runs it; stdin (if
// not empty) is its input. It returns its standard output, and on failure
// its standard error in the error.
func (cp *ControlPlane) Istioctl(ctx context.Context, stdin string, args ...string) ([]byte, error) {
	bin := cp.bins.Istioctl()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("istiolab: %w (run make istio-bins)", err)
	}
	cmd := cp.Node.NS.Command(ctx, bin, append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + cp.dir("home")}
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("istiolab: istioctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
