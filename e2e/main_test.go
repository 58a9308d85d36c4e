package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	// The daemon under test is built from these packages in TestMain; the
	// import makes Go's test cache see changes to them, so an edit to the
	// daemon re-runs the end-to-end tests.
	_ "github.com/ztunnel-go/ztunnel/internal/app"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// ztunnelBin is the daemon binary built once for the package.
var ztunnelBin string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if addr := os.Getenv(echoHelperEnv); addr != "" {
		return runEchoHelper(addr)
	}
	if netnslab.Missing() == "" {
		dir, err := os.MkdirTemp("", "ztunnel-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		ztunnelBin = filepath.Join(dir, "ztunnel")
		args := []string{"build", "-o", ztunnelBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "github.com/ztunnel-go/ztunnel/cmd/ztunnel")...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building the daemon:", err)
			return 1
		}
	}
	return m.Run()
}
