package netnslab

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// skipChildEnv makes the test binary, re-run by TestSkip, act as the test that
// skips: its value is the reason to skip with.
const skipChildEnv = "NETNSLAB_TEST_SKIP_CHILD"

// TestSkipChild is the child half of TestSkip; run directly it does nothing.
func TestSkipChild(t *testing.T) {
	reason := os.Getenv(skipChildEnv)
	if reason == "" {
		return
	}
	Skip(t, reason)
	t.Error("Skip returned")
}

// TestSkip runs a test that calls Skip in a child process (a real go test
// binary, so a skip and a failure are what go test itself reports) and checks
// its outcome and the line it leaves in the skip log.
func TestSkip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		require string // value of NETNSLAB_REQUIRE in the child
		log     bool   // NETNSLAB_SKIP_LOG set in the child
		reason  string
		wantOK  bool   // the child test binary exits 0
		wantOut string // in the child's output
		wantLog string // the log's content ("" when none is written)
	}{
		{name: "skips and logs", log: true, reason: "iptables not found", wantOK: true,
			wantOut: "--- SKIP: TestSkipChild", wantLog: "\tTestSkipChild\tiptables not found\n"},
		{name: "skips without a log", reason: "not root", wantOK: true, wantOut: "--- SKIP: TestSkipChild"},
		{name: "one line per skip", log: true, reason: "two\nlines", wantOK: true,
			wantOut: "--- SKIP", wantLog: "\tTestSkipChild\ttwo lines\n"},
		{name: "required fails", require: "1", log: true, reason: "not root", wantOK: false,
			wantOut: "--- FAIL: TestSkipChild"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "skips")
			cmd := exec.Command(os.Args[0], "-test.run=^TestSkipChild$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), skipChildEnv+"="+tc.reason, RequireEnv+"="+tc.require, SkipLogEnv+"=")
			if tc.log {
				cmd.Env = append(cmd.Env, SkipLogEnv+"="+logPath)
			}
			out, err := cmd.CombinedOutput()
			if ok := err == nil; ok != tc.wantOK {
				t.Fatalf("child exit ok = %v (%v), want %v; output:\n%s", ok, err, tc.wantOK, out)
			}
			if !strings.Contains(string(out), tc.wantOut) {
				t.Errorf("child output lacks %q:\n%s", tc.wantOut, out)
			}
			got, err := os.ReadFile(logPath)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if tc.wantLog == "" {
				if len(got) != 0 {
					t.Errorf("skip log = %q, want none", got)
				}
				return
			}
			wd, _ := os.Getwd()
			if want := wd + tc.wantLog; string(got) != want {
				t.Errorf("skip log = %q, want %q", got, want)
			}
		})
	}
}
