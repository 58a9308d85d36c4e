package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

var when = time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)

// record builds what the proxy logs for a completed connection.
func accessRecord(level slog.Level, msg string, err error) slog.Record {
	r := slog.NewRecord(when, level, msg, 0)
	r.AddAttrs(
		slog.Any("src.addr", netip.MustParseAddrPort("10.0.0.1:4242")),
		slog.String("src.workload", "sleep"),
		slog.String("dst.identity", "spiffe://cluster.local/ns/default/sa/httpbin"),
		slog.String("direction", "outbound"),
		slog.Int64("bytes_sent", 82),
		slog.Int64("bytes_recv", 344),
		slog.String("duration", "2ms"),
	)
	if err != nil {
		r.AddAttrs(slog.Any("error", err))
	}
	r.AddAttrs(slog.String("scope", "access"))
	return r
}

func TestPlainFormat(t *testing.T) {
	tests := []struct {
		name string
		rec  slog.Record
		with []slog.Attr
		want string
	}{
		{
			name: "access log",
			rec:  accessRecord(slog.LevelInfo, "connection complete", nil),
			want: "2026-01-02T03:04:05.123456Z\tinfo\taccess\tconnection complete\t" +
				`src.addr=10.0.0.1:4242 src.workload="sleep" dst.identity="spiffe://cluster.local/ns/default/sa/httpbin" direction="outbound" bytes_sent=82 bytes_recv=344 duration="2ms"` + "\n",
		},
		{
			name: "access log with error",
			rec:  accessRecord(slog.LevelError, "connection complete", errors.New(`connection reset "x"`)),
			want: "2026-01-02T03:04:05.123456Z\terror\taccess\tconnection complete\t" +
				`src.addr=10.0.0.1:4242 src.workload="sleep" dst.identity="spiffe://cluster.local/ns/default/sa/httpbin" direction="outbound" bytes_sent=82 bytes_recv=344 duration="2ms" error="connection reset \"x\""` + "\n",
		},
		{
			name: "no fields, default scope",
			rec:  slog.NewRecord(when, slog.LevelWarn, "hello", 0),
			want: "2026-01-02T03:04:05.123456Z\twarn\tztunnel\thello\t\n",
		},
		{
			name: "scope and fields from With, groups flattened",
			rec: func() slog.Record {
				r := slog.NewRecord(when, slog.LevelInfo, "pool", 0)
				r.AddAttrs(slog.Group("conn", slog.Int("streams", 3), slog.Bool("idle", false)), slog.Duration("age", 1500*time.Millisecond))
				return r
			}(),
			with: []slog.Attr{slog.String("scope", "hbone"), slog.String("peer", "10.0.0.2")},
			want: "2026-01-02T03:04:05.123456Z\tinfo\tproxy::pool\tpool\t" + `peer="10.0.0.2" conn.streams=3 conn.idle=false age=1.5s` + "\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			var h slog.Handler = NewHandler(&buf, Options{})
			h = h.WithAttrs(tc.with)
			if err := h.Handle(context.Background(), tc.rec); err != nil {
				t.Fatal(err)
			}
			if got := buf.String(); got != tc.want {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

func TestJSONFormat(t *testing.T) {
	var buf bytes.Buffer
	h := NewHandler(&buf, Options{Format: "json"})
	if err := h.Handle(context.Background(), accessRecord(slog.LevelError, "connection complete", errors.New("boom\n"))); err != nil {
		t.Fatal(err)
	}
	want := `{"level":"error","time":"2026-01-02T03:04:05.123456Z","scope":"access","message":"connection complete",` +
		`"src.addr":"10.0.0.1:4242","src.workload":"sleep","dst.identity":"spiffe://cluster.local/ns/default/sa/httpbin",` +
		`"direction":"outbound","bytes_sent":82,"bytes_recv":344,"duration":"2ms","error":"boom\n"}` + "\n"
	if got := buf.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// Odd values still make valid JSON.
	buf.Reset()
	h.WithGroup("g").Handle(context.Background(), func() slog.Record {
		r := slog.NewRecord(when, slog.LevelInfo, "odd \x01 \xff \"msg\"", 0)
		r.AddAttrs(slog.Float64("nan", nanFloat()), slog.Any("list", []int{1, 2}), slog.Any("ch", make(chan int)), slog.Time("t", when))
		return r
	}())
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("invalid JSON %q: %v", buf.String(), err)
	}
	if m["message"] != "odd \x01 \ufffd \"msg\"" || m["scope"] != "ztunnel" || m["g.list"] == nil {
		t.Errorf("decoded %v", m)
	}
}

// TestZtunnelTargets (issue 34): records are written under ztunnel's
// targets, its module paths (plain: without the crate prefix; JSON: with
// it, but for the targets ztunnel names itself), and RUST_LOG directives
// written for ztunnel select them: by module path, with or without the
// crate, or by its first segment.
func TestZtunnelTargets(t *testing.T) {
	for _, tc := range []struct {
		scope, plain, json string
	}{
		{"xds", "xds::client", "ztunnel::xds::client"},
		{"identity", "identity::manager", "ztunnel::identity::manager"},
		{"inpod", "inpod::statemanager", "ztunnel::inpod::statemanager"},
		{"hbone", "proxy::pool", "ztunnel::proxy::pool"},
		{"proxy::h2::server", "proxy::h2::server", "ztunnel::proxy::h2::server"},
		{"access", "access", "access"},
		{"dns", "dns", "dns"},
		{"", "ztunnel", "ztunnel"},
	} {
		t.Run(tc.plain, func(t *testing.T) {
			for _, format := range []string{"plain", "json"} {
				var buf bytes.Buffer
				log := New(&buf, Options{Format: format})
				if tc.scope != "" {
					log = log.With("scope", tc.scope)
				}
				log.Info("hello")
				want := "\t" + tc.plain + "\thello"
				if format == "json" {
					want = `"scope":"` + tc.json + `"`
				}
				if !strings.Contains(buf.String(), want) {
					t.Errorf("%s: %q lacks %q", format, buf.String(), want)
				}
			}
		})
	}
	for _, spec := range []string{"info,xds=debug", "info,ztunnel::xds=debug", "info,xds::client=debug", "info,ztunnel::xds::client=debug"} {
		levels, err := NewLevels(spec)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		New(&buf, Options{Levels: levels}).Debug("delta", "scope", "xds")
		if !strings.Contains(buf.String(), "xds::client\tdelta") {
			t.Errorf("RUST_LOG=%s: debug record of xds::client not logged: %q", spec, buf.String())
		}
	}
}

func nanFloat() float64 {
	var z float64
	return z / z
}

// TestScopeLevels: a record's scope attribute, or the logger's, selects
// the level that applies; the admin change takes effect at once, also for
// loggers whose scope level is cached.
func TestScopeLevels(t *testing.T) {
	levels, err := NewLevels("info")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := New(&buf, Options{Levels: levels})
	access := log.With("scope", "access")
	lines := func() int {
		n := strings.Count(buf.String(), "\n")
		buf.Reset()
		return n
	}

	access.Debug("connection opened")
	log.Debug("connection opened", "scope", "access")
	log.Info("info goes through", "scope", "hbone")
	if n := lines(); n != 1 {
		t.Fatalf("at info: %d lines, want 1", n)
	}
	if access.Enabled(context.Background(), slog.LevelDebug) {
		t.Fatal("access logger enabled at debug under info")
	}

	if err := levels.Set("access=debug"); err != nil {
		t.Fatal(err)
	}
	if !access.Enabled(context.Background(), slog.LevelDebug) {
		t.Fatal("access logger not enabled at debug after the change")
	}
	access.Debug("connection opened")
	log.Debug("connection opened", "scope", "access")
	log.Debug("hbone debug stays off", "scope", "hbone")
	log.Debug("default scope debug stays off")
	if n := lines(); n != 2 {
		t.Fatalf("after access=debug: %d lines, want 2", n)
	}

	if err := levels.Reset(""); err != nil {
		t.Fatal(err)
	}
	access.Debug("connection opened")
	if n := lines(); n != 0 {
		t.Fatalf("after reset: %d lines, want 0", n)
	}
	if err := levels.Set("off"); err != nil {
		t.Fatal(err)
	}
	log.Error("nothing at off")
	if n := lines(); n != 0 {
		t.Fatalf("at off: %d lines", n)
	}
}

func TestNilLevelsLogsInfo(t *testing.T) {
	var buf bytes.Buffer
	log := New(&buf, Options{DefaultScope: "app"})
	log.Debug("no")
	log.Info("yes")
	if got := buf.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "\tinfo\tapp\tyes\t") {
		t.Fatalf("%q", got)
	}
}

// TestConcurrentLoggingAndChanges runs under -race: writes stay whole lines
// while the filter changes.
func TestConcurrentLoggingAndChanges(t *testing.T) {
	levels, _ := NewLevels("info")
	var buf safeBuffer
	log := New(&buf, Options{Levels: levels}).With("scope", "access")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				log.Info("connection complete", "i", i, "g", g)
			}
		}()
	}
	for i := range 50 {
		levels.Set(fmt.Sprintf("access=%s", []string{"debug", "info"}[i%2]))
	}
	wg.Wait()
	for _, line := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		if !strings.Contains(line, "\tinfo\taccess\tconnection complete\t") {
			t.Fatalf("mangled line %q", line)
		}
	}
}

type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func BenchmarkAccessLog(b *testing.B) {
	levels, _ := NewLevels("info")
	var out discard
	log := New(&out, Options{Levels: levels}).With("scope", "access")
	b.Run("disabled-debug", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			log.Debug("connection opened", "src.addr", "10.0.0.1:4242")
		}
	})
	b.Run("plain-complete", func(b *testing.B) {
		h := log.Handler()
		r := accessRecord(slog.LevelInfo, "connection complete", nil)
		b.ReportAllocs()
		for b.Loop() {
			h.Handle(context.Background(), r)
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
