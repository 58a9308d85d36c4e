package xdsclient_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel/xdsclient"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

// logRec records the client's log lines with their levels.
type logRec struct {
	t     *testing.T
	mu    sync.Mutex // guards lines
	lines []logLine
	added chan struct{} // one token per line, for waiters
}

type logLine struct {
	level slog.Level
	msg   string
}

func newLogRec(t *testing.T) *logRec { return &logRec{t: t, added: make(chan struct{}, 1000)} }

func (r *logRec) logf(l slog.Level, f string, a ...any) {
	msg := fmt.Sprintf(f, a...)
	r.t.Logf("%s %s", l, msg)
	r.mu.Lock()
	r.lines = append(r.lines, logLine{l, msg})
	r.mu.Unlock()
	select {
	case r.added <- struct{}{}:
	default:
	}
}

// wait returns the first line containing substr, waiting for it.
func (r *logRec) wait(t *testing.T, substr string) logLine {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		r.mu.Lock()
		for _, l := range r.lines {
			if strings.Contains(l.msg, substr) {
				r.mu.Unlock()
				return l
			}
		}
		r.mu.Unlock()
		select {
		case <-r.added:
		case <-deadline:
			t.Fatalf("no log line containing %q", substr)
		}
	}
}

// TestRootFileLateIsRetried: XDS_ROOT_CA names a file Kubernetes has not
// mounted yet, then one holding no certificate: Run keeps retrying with
// backoff and says why at warn (ztunnel: "XDS client connection error"),
// and the client syncs once the real file appears.
func TestRootFileLateIsRetried(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Set(typeA, "a1", "v1", str("one"))
	srv.Set(typeB, "b1", "v1", wrapperspb.UInt32(1))
	path := filepath.Join(t.TempDir(), "root-cert.pem")
	logs := newLogRec(t)
	r := newRig(t, srv, func(c *xdsclient.Config) { c.RootCA, c.Logf = path, logs.logf }).start(t)

	if l := logs.wait(t, "no such file"); l.level != slog.LevelWarn || !strings.Contains(l.msg, "connection error") {
		t.Errorf("missing root file logged as %s %q, want a warn connection error", l.level, l.msg)
	}
	if err := os.WriteFile(path, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if l := logs.wait(t, "no PEM certificate"); l.level != slog.LevelWarn {
		t.Errorf("bad root file logged at %s, want warn", l.level)
	}
	select {
	case <-r.client.Synced():
		t.Fatal("synced without verifying the server")
	default:
	}
	if err := os.WriteFile(path, srv.TLS().RootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	r.waitSynced(t)
	if got := r.a.snapshot()["a1"]; got != "one" {
		t.Errorf("a1 = %q after the root file appeared", got)
	}
}

// TestNackLoggedAtError: a rejected resource is logged at error, as
// ztunnel's "sending response" with type NACK.
func TestNackLoggedAtError(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	srv.Set(typeA, "bad", "v1", str("x"))
	srv.Set(typeB, "b1", "v1", wrapperspb.UInt32(1))
	logs := newLogRec(t)
	r := newRig(t, srv, func(c *xdsclient.Config) { c.Logf = logs.logf })
	r.a.setReject("bad", "invalid workload")
	r.start(t)
	if l := logs.wait(t, "NACK"); l.level != slog.LevelError || !strings.Contains(l.msg, "bad: invalid workload") {
		t.Errorf("NACK logged as %s %q, want error naming the resource and reason", l.level, l.msg)
	}
	if l := logs.wait(t, "established"); l.level != slog.LevelInfo {
		t.Errorf("stream establishment logged at %s, want info", l.level)
	}
}
