package logging

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

func TestNewLevels(t *testing.T) {
	tests := []struct {
		spec   string
		want   string // String()
		levels map[string]slog.Level
	}{
		{"", "info", map[string]slog.Level{"access": slog.LevelInfo, "proxy": slog.LevelInfo}},
		{"debug", "debug", map[string]slog.Level{"x": slog.LevelDebug}},
		{"info,access=debug", "access=debug,info", map[string]slog.Level{"access": slog.LevelDebug, "proxy": slog.LevelInfo}},
		{"access=debug, info ", "access=debug,info", nil},
		{"WARN", "warn", map[string]slog.Level{"a": slog.LevelWarn}},
		{"warning", "warn", nil},
		{"3", "info", nil},
		{"0", "off", map[string]slog.Level{"a": LevelOff}},
		{"trace", "trace", map[string]slog.Level{"a": LevelTrace}},
		// No bare level: what no directive matches is off, as RUST_LOG.
		{"access=debug", "access=debug", map[string]slog.Level{"access": slog.LevelDebug, "proxy": LevelOff}},
		// Targets match scopes by prefix; the longest wins.
		{"info,proxy=debug,proxy::inbound=error", "proxy::inbound=error,proxy=debug,info", map[string]slog.Level{
			"proxy": slog.LevelDebug, "proxy::outbound": slog.LevelDebug, "proxy::inbound": slog.LevelError, "hbone": slog.LevelInfo}},
		// ztunnel's module targets: ztunnel::x is our scope x.
		{"info,ztunnel::proxy=debug", "ztunnel::proxy=debug,info", map[string]slog.Level{"proxy": slog.LevelDebug, "access": slog.LevelInfo}},
		// "ztunnel" covers every module, but the access log is not one.
		{"warn,ztunnel=debug", "ztunnel=debug,warn", map[string]slog.Level{"hbone": slog.LevelDebug, "access": slog.LevelWarn}},
		// tracing reads a bare target as that target at trace.
		{"info,hbone", "hbone=trace,info", map[string]slog.Level{"hbone": LevelTrace}},
		// istioctl's colon form; "::" stays part of the target.
		{"info,access:debug,ztunnel::proxy:warn", "access=debug,ztunnel::proxy=warn,info", map[string]slog.Level{"access": slog.LevelDebug, "proxy": slog.LevelWarn}},
		// hickory, which ztunnel's default filter silences, is harmless here.
		{"hickory_server::server=off,info", "hickory_server::server=off,info", nil},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			l, err := NewLevels(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := l.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
			for scope, want := range tc.levels {
				if got := l.Level(scope); got != want {
					t.Errorf("Level(%q) = %v, want %v", scope, got, want)
				}
			}
		})
	}
}

func TestNewLevelsErrors(t *testing.T) {
	for _, spec := range []string{"info,access=loud", "access[conn]=debug", "access{x}=info", "=debug", "a b=info"} {
		if _, err := NewLevels(spec); !errors.Is(err, ErrBadDirective) {
			t.Errorf("NewLevels(%q) = %v, want ErrBadDirective", spec, err)
		}
	}
}

// TestSetAndReset follows ztunnel's admin semantics (src/telemetry.rs
// set_level and the test_change_log_level sequence in src/admin.rs): a
// change applies on top of the current filter, a reset on top of the
// startup filter, and a bare word that is not a level is refused.
func TestSetAndReset(t *testing.T) {
	l, err := NewLevels("info")
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		reset   bool
		spec    string
		want    string
		wantErr bool
	}{
		{false, "", "info", false},
		{true, "", "info", false},
		{true, "invalid_level", "info", true},
		{false, "invalid_level", "info", true},
		{true, "debug", "debug", false},
		{true, "access=debug,info", "access=debug,info", false},
		{false, "proxy:warn", "access=debug,proxy=warn,info", false},
		{false, "access=error", "access=error,proxy=warn,info", false},
		{false, "trace", "access=error,proxy=warn,trace", false},
		{true, "warn", "warn", false},
		{true, "error", "error", false},
		{true, "off", "off", false},
		{true, "", "info", false},
	}
	for i, s := range steps {
		var err error
		if s.reset {
			err = l.Reset(s.spec)
		} else {
			err = l.Set(s.spec)
		}
		if (err != nil) != s.wantErr {
			t.Fatalf("step %d (%+v): err = %v", i, s, err)
		}
		if got := l.String(); got != s.want {
			t.Fatalf("step %d (%+v): %q, want %q", i, s, got, s.want)
		}
	}
}

// FuzzLevels: whatever an operator sends, parsing does not panic, and a
// filter's printed form reads back as the same filter.
func FuzzLevels(f *testing.F) {
	for _, s := range []string{"info", "info,access=debug", "ztunnel::proxy:warn", "a=b=c", "::", ":", "x:", ",,,", "ztunnel=off,3"} {
		fuzzseed.Add(f, s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		l, err := NewLevels("info")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Set(spec); err != nil {
			return
		}
		printed := l.String()
		again, err := NewLevels(printed)
		if err != nil {
			t.Fatalf("printed filter %q (from %q) does not parse: %v", printed, spec, err)
		}
		if again.String() != printed {
			t.Fatalf("round trip %q -> %q", printed, again.String())
		}
	})
}
