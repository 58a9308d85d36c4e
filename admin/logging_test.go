package admin

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/logging"
	"github.com/ztunnel-go/ztunnel/state"
)

func do(s *Server, method, target string) (int, string) {
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = "127.0.0.1:1"
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// TestLoggingChangesLevelLive drives /logging as istioctl ztunnel-config log
// does and checks that a logger already in use follows the change.
func TestLoggingChangesLevelLive(t *testing.T) {
	levels, err := logging.NewLevels("info")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	access := logging.New(&out, logging.Options{Levels: levels}).With("scope", "access")
	s := NewServer(Config{State: state.NewStore(state.Empty()), Logging: levels})
	logged := func() bool {
		out.Reset()
		access.Debug("connection opened")
		return out.Len() > 0
	}

	steps := []struct {
		method, target string
		code           int
		body           string // expected substring
		debugLogged    bool
	}{
		{"POST", "/logging", 200, "current log level is info\n", false},
		{"GET", "/logging", 405, "Invalid HTTP method", false},
		{"POST", "/logging?level=", 200, "current log level is info\n", false}, // istioctl's "show"
		{"POST", "/logging?level=access=debug", 200, "current log level is access=debug,info\n", true},
		{"POST", "/logging?level=access:warn,hbone:debug", 200, "current log level is access=warn,hbone=debug,info\n", false},
		{"POST", "/logging?level=debug", 200, "current log level is access=warn,hbone=debug,debug\n", false},
		{"POST", "/logging?level=info&reset", 200, "current log level is info\n", false}, // istioctl --reset
		{"POST", "/logging?reset&level=access%3Ddebug", 200, "current log level is access=debug,info\n", true},
		{"POST", "/logging?level=loud", 400, "invalid level", true},
		{"GET", "/logging?level=debug", 405, "Invalid HTTP method", true},
		{"PUT", "/logging", 405, "Invalid HTTP method", true},
		{"POST", "/logging?reset", 200, "current log level is info\n", false},
	}
	for i, st := range steps {
		code, body := do(s, st.method, st.target)
		if code != st.code || !strings.Contains(body, st.body) {
			t.Fatalf("step %d %s %s: %d %q, want %d containing %q", i, st.method, st.target, code, body, st.code, st.body)
		}
		if got := logged(); got != st.debugLogged {
			t.Fatalf("step %d %s %s: access debug logged=%v, want %v", i, st.method, st.target, got, st.debugLogged)
		}
	}
}

func TestLoggingNotWired(t *testing.T) {
	s := NewServer(Config{State: state.NewStore(state.Empty())})
	if code, _ := do(s, "POST", "/logging"); code != http.StatusInternalServerError {
		t.Fatalf("status %d", code)
	}
}

func TestIndexListsEndpoints(t *testing.T) {
	s := NewServer(Config{State: state.NewStore(state.Empty()), Logger: slog.New(slog.DiscardHandler)})
	code, body := do(s, "GET", "/")
	if code != 200 {
		t.Fatal(code)
	}
	for _, p := range []string{"/config_dump", "/logging", "/quitquitquit", "/debug/pprof/profile", "/debug/pprof/heap"} {
		if !strings.Contains(body, `href="`+p) {
			t.Errorf("index does not link %s", p)
		}
	}
}

func TestPprofEndpoints(t *testing.T) {
	s := NewServer(Config{State: state.NewStore(state.Empty())})
	for _, tc := range []struct {
		method, target string
		code           int
		body           string
	}{
		{"GET", "/debug/pprof/profile?seconds=0", 400, "invalid seconds value; expected 1-300\n"},
		{"GET", "/debug/pprof/profile?seconds=301", 400, "invalid seconds value; expected 1-300\n"},
		{"GET", "/debug/pprof/profile?seconds=-1", 400, "invalid seconds value; expected 1-300\n"},
		{"GET", "/debug/pprof/profile?seconds=1&frequency=5000", 400, "invalid frequency value; expected 1-1000\n"},
		{"GET", "/debug/pprof/heap/profiling", 200, "heap profiling active: true\n"},
		{"POST", "/debug/pprof/heap/profiling?activate=true", 200, "heap profiling active: true\n"},
		{"POST", "/debug/pprof/heap/profiling?activate=maybe", 400, `invalid activate value "maybe"; expected true or false`},
		{"GET", "/nope", 404, ""},
		{"GET", "/debug/pprof/goroutine?debug=1", 200, "goroutine profile"},
		{"GET", "/debug/pprof/heap?debug=1", 200, "heap profile"},
		{"GET", "/debug/pprof/contention", 200, "inactive"},
		{"GET", "/debug/pprof/contention?activate=true", 405, "POST"},
		{"POST", "/debug/pprof/contention?activate=maybe", 400, "true or false"},
		{"POST", "/debug/pprof/contention?activate=true", 200, "is active"},
		{"GET", "/debug/pprof/mutex?debug=1", 200, "mutex"},
		{"POST", "/debug/pprof/contention?activate=false", 200, "inactive"},
	} {
		code, body := do(s, tc.method, tc.target)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("%s %s: %d %.200q, want %d containing %q", tc.method, tc.target, code, body, tc.code, tc.body)
		}
	}
}
