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

// RequireEnv names the environment variable that turns the lab's skips into
// failures: set it in the CI job that must run the lab tests, so that they cannot
// pass by silently skipping.
const RequireEnv = "NETNSLAB_REQUIRE"

// SkipLogEnv names the environment variable holding the path of a file to which
// [Skip] appends one line per skipped test, so that `make test` (which sets it to a
// temporary file) can say at the end how many lab tests did not run and why; go
// test's own output shows a skip only with -v.
const SkipLogEnv = "NETNSLAB_SKIP_LOG"

// Capability bits (linux/capability.h).
const (
	capNetAdmin = 12
	capSysAdmin = 21
)

// RequireRoot skips the test unless the process can build labs: root (or at least
// CAP_SYS_ADMIN and CAP_NET_ADMIN) and the ip, iptables and iptables-restore
// commands. It skips through [Skip], so with NETNSLAB_REQUIRE=1 it fails instead.
// With -short (make test-short) it skips every lab test, by request rather than
// for want of anything, so that skip is neither logged nor a failure.
func RequireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("netnslab: lab tests do not run with -short")
	}
	if reason := Missing(); reason != "" {
		Skip(t, "lab test needs root with ip and iptables: "+reason)
	}
}

// RequireTool returns the path of the command name, or skips the test through
// [Skip] when it is not installed; pkg is the Debian package that provides it,
// named in the skip so the reader knows what to install.
func RequireTool(t testing.TB, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Skip(t, fmt.Sprintf("%s not found (apt-get install -y %s)", name, pkg))
	}
	return path
}

// Skip skips a test that cannot run because the machine lacks what it needs
// (root, a lab tool, an interop peer), and is the one way tests of this module
// skip for such a reason: it appends the test and reason to the file named by
// NETNSLAB_SKIP_LOG, if set, and with NETNSLAB_REQUIRE set it fails the test
// instead of skipping it.
func Skip(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("netnslab: %s (and %s is set, so this test must run)", reason, RequireEnv)
	}
	if path := os.Getenv(SkipLogEnv); path != "" {
		if err := appendSkip(path, t.Name(), reason); err != nil {
			t.Logf("netnslab: recording the skip in %s: %v", path, err)
		}
	}
	t.Skip("netnslab: " + reason)
}

// appendSkip writes one line "dir<TAB>test<TAB>reason" to the log. The file is
// shared by the test binaries go test runs in parallel: each line goes out in
// one O_APPEND write, which the kernel does not interleave with another's.
func appendSkip(path, test, reason string) error {
	dir, _ := os.Getwd()
	line := strings.Join([]string{dir, test, strings.ReplaceAll(reason, "\n", " ")}, "\t") + "\n"
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte(line))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
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
