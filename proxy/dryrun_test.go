package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
)

// recordLog keeps every record's message and attributes (with those of
// WithAttrs) at every level.
type recordLog struct {
	attrs []slog.Attr
	mu    *sync.Mutex
	recs  *[]map[string]string
}

func newRecordLog() *recordLog {
	return &recordLog{mu: new(sync.Mutex), recs: new([]map[string]string)}
}

func (h *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordLog) WithGroup(string) slog.Handler            { return h }
func (h *recordLog) WithAttrs(a []slog.Attr) slog.Handler {
	return &recordLog{attrs: append(append([]slog.Attr(nil), h.attrs...), a...), mu: h.mu, recs: h.recs}
}
func (h *recordLog) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message, "level": r.Level.String()}
	for _, a := range h.attrs {
		m[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	*h.recs = append(*h.recs, m)
	h.mu.Unlock()
	return nil
}

// find returns the records whose message is msg.
func (h *recordLog) find(msg string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, m := range *h.recs {
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestDryRunPolicies: a dry-run DENY that matches lets the connection
// through and is logged as ztunnel logs it ("dry-run: deny policy match",
// the policy's key), as is a dry-run ALLOW that would deny because it does
// not match; at debug, or at info with AUTHZ_POLICY_INFO_LOGGING.
func TestDryRunPolicies(t *testing.T) {
	app := echoApp(t)
	yaml := fmt.Sprintf(srvPolicyConfig+`- name: deny-app
  namespace: ns
  scope: Namespace
  action: Deny
  dryRun: true
  rules:
  - - - destinationPorts: [%d]
- name: allow-other
  namespace: ns
  scope: Namespace
  action: Allow
  dryRun: true
  rules:
  - - - principals: [{Exact: "cluster.local/ns/ns/sa/someone-else"}]
`, app)
	for _, tc := range []struct {
		name      string
		infoLevel bool
		want      slog.Level
	}{
		{"debug", false, slog.LevelDebug},
		{"AUTHZ_POLICY_INFO_LOGGING", true, slog.LevelInfo},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := newRecordLog()
			rig := startProxy(t, yaml, "srv", func(c *Config) {
				c.Logger, c.PolicyInfoLogging = slog.New(logs), tc.infoLevel
			})
			in := &inboundRig{hbonePort: rig.p.Addrs()[2].(*net.TCPAddr).Port, ca: rig.ca}
			s, err := in.connect(t, "client", fmt.Sprintf("127.0.0.1:%d", app))
			if err != nil {
				t.Fatalf("a dry-run DENY refused the connection: %v", err)
			}
			s.Write([]byte("dry run"))
			s.CloseWrite()
			if got, err := io.ReadAll(s); err != nil || string(got) != "dry run" {
				t.Fatalf("echo: %q, %v", got, err)
			}
			s.Close()
			deny := logs.find("dry-run: deny policy match")
			if len(deny) != 1 || deny[0]["policy"] != "ns/deny-app" || deny[0]["scope"] != "state" || deny[0]["level"] != tc.want.String() {
				t.Errorf("deny records %v, want one for ns/deny-app at %s, scope state", deny, tc.want)
			}
			if deny := logs.find("dry-run: no allow policies match"); len(deny) != 1 || deny[0]["level"] != tc.want.String() {
				t.Errorf("would-deny records %v, want one at %s", deny, tc.want)
			}
			if allow := logs.find("dry-run: allow policy match"); len(allow) != 0 {
				t.Errorf("a dry-run ALLOW that does not match was logged: %v", allow)
			}
		})
	}
}
