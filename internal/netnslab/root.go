package netnslab

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// RequireEnv names the environment variable that turns RequireRoot's skip into a
// failure: set it in the CI job that must run the lab tests, so that they cannot pass
// by silently skipping.
const RequireEnv = "NETNSLAB_REQUIRE"

// Capability bits (linux/capability.h).
const (
	capNetAdmin = 12
	capSysAdmin = 21
)

// RequireRoot skips the test unless the process can build labs: root (or at least
// CAP_SYS_ADMIN and CAP_NET_ADMIN) and the ip, iptables and iptables-restore
// commands. With NETNSLAB_REQUIRE=1 it fails the test instead.
func RequireRoot(t testing.TB) {
	t.Helper()
	if reason := Missing(); reason != "" {
		msg := "netnslab: lab test needs root with ip and iptables: " + reason
		if os.Getenv(RequireEnv) != "" {
			t.Fatal(msg + " (and " + RequireEnv + " is set)")
		}
		t.Skip(msg)
	}
}

// Missing reports why labs cannot be built here, or "" when they can.
func Missing() string {
	if os.Geteuid() != 0 {
		return fmt.Sprintf("running as uid %d, not root", os.Geteuid())
	}
	for _, c := range []string{"ip", "iptables", "iptables-restore"} {
		if _, err := exec.LookPath(c); err != nil {
			return fmt.Sprintf("%s not found (apt-get install -y iproute2 iptables)", c)
		}
	}
	caps, err := effectiveCaps()
	if err != nil {
		return err.Error()
	}
	for _, c := range []struct {
		bit  uint
		name string
	}{{capSysAdmin, "CAP_SYS_ADMIN"}, {capNetAdmin, "CAP_NET_ADMIN"}} {
		if caps&(1<<c.bit) == 0 {
			return "missing capability " + c.name
		}
	}
	return ""
}

func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read capabilities: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("read capabilities: no CapEff in /proc/self/status")
}
