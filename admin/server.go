package admin

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"html"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"time"

	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/state"
)

// Config wires the admin server to what it reports on.
type Config struct {
	// State is the workload/service/policy snapshot to dump.
	State *state.Store
	// Certs is the certificate cache to dump; nil dumps none.
	Certs *mtls.Store
	// StaticConfig is the local config as loaded, for "staticConfig"; nil
	// when there is none.
	StaticConfig *state.Snapshot
	// DaemonConfig is the parsed daemon configuration, for "config".
	DaemonConfig any
	// Version fills "version".
	Version BuildInfo
	// Quit is called by POST /quitquitquit to start a graceful shutdown.
	Quit func()
	// Logging is the live log filter of /logging; nil answers 500 there.
	Logging LogLevels
	// Logger receives errors.
	Logger *slog.Logger
	// WorkloadState returns the in-pod (shared mode) pods for
	// "workloadState"; nil omits the key.
	WorkloadState func() map[string]WorkloadStateDump
	// Engine returns the relay engine's section, "engine"; nil omits the
	// key.
	Engine func() EngineDump
}

// Server is the admin HTTP server (localhost only).
type Server struct {
	cfg Config
	mux *http.ServeMux
}

// NewServer returns the admin handler set.
func NewServer(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux()}
	s.mux.HandleFunc("/", s.index)
	s.mux.HandleFunc("/config_dump", s.configDump)
	s.mux.HandleFunc("/quitquitquit", s.quit)
	s.mux.HandleFunc("/logging", s.logging)
	s.routePprof()
	return s
}

// ServeHTTP refuses any client that is not on loopback (defence in depth:
// the listener is bound to localhost too), then dispatches.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !fromLoopback(r.RemoteAddr) {
		http.Error(w, "admin is only available on localhost", http.StatusForbidden)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func fromLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

var endpoints = []struct{ path, help string }{
	{"/config_dump", "dump the current workloads, services, policies and certificates"},
	{"/logging", "show the log filter; POST ?level=<level> or ?level=<scope>=<level>,... changes it, ?reset restores it"},
	{"/quitquitquit", "POST: drain connections and exit"},
	{"/debug/pprof/", "Go profiles: index of heap, goroutine, allocs, threadcreate, mutex, block"},
	{"/debug/pprof/profile", "CPU profile; seconds (1-300, default 10)"},
	{"/debug/pprof/heap", "heap profile"},
	{"/debug/pprof/heap/profiling", "heap profiling state (always active in Go; ?activate=true accepted)"},
	{"/debug/pprof/goroutine?debug=2", "goroutine stacks"},
	{"/debug/pprof/trace", "execution trace; seconds (default 1)"},
	{"/debug/pprof/contention", "mutex and block profiling state; POST ?activate=true|false"},
}

func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		// ztunnel's: an empty 404.
		w.WriteHeader(http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprint(w, "<html><head><title>ztunnel-go admin</title></head><body><h1>ztunnel-go admin</h1><ul>")
	for _, e := range endpoints {
		fmt.Fprintf(w, `<li><a href="%s">%s</a>: %s</li>`, e.path, e.path, html.EscapeString(e.help))
	}
	fmt.Fprint(w, "</ul></body></html>")
}

// Dump builds the config dump from the current snapshot and certificates.
func (s *Server) Dump() ConfigDump {
	snap := s.cfg.State.Load()
	d := ConfigDump{
		Workloads: []WorkloadDump{}, Services: []ServiceDump{}, Policies: []PolicyDump{},
		StagedServices: map[string]map[string]any{}, StaticConfig: StaticDump{Workloads: []WorkloadDump{}, Services: []ServiceDump{}, Policies: []PolicyDump{}},
		Version: s.cfg.Version, Config: s.cfg.DaemonConfig, Certificates: []CertsDump{},
	}
	if sc := s.cfg.StaticConfig; sc != nil {
		d.StaticConfig.Workloads, d.StaticConfig.Services, d.StaticConfig.Policies = dumpSnapshot(sc)
	}
	if d.Version.GoVersion == "" {
		d.Version.GoVersion = runtime.Version()
	}
	d.Workloads, d.Services, d.Policies = dumpSnapshot(snap)
	if s.cfg.WorkloadState != nil {
		d.WorkloadState = s.cfg.WorkloadState()
	}
	if s.cfg.Engine != nil {
		e := s.cfg.Engine()
		d.Engine = &e
	}
	if s.cfg.Certs != nil {
		for _, st := range s.cfg.Certs.CertStates() {
			d.Certificates = append(d.Certificates, dumpCert(st))
		}
	}
	return d
}

func (s *Server) configDump(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	body, done := compressed(w, r)
	enc := json.NewEncoder(body)
	enc.SetIndent("", "  ")
	err := enc.Encode(s.Dump())
	if derr := done(); err == nil {
		err = derr
	}
	if err != nil {
		s.cfg.Logger.Debug("config dump write failed", "error", err)
	}
}

func (s *Server) quit(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		// ztunnel's: an empty 405.
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	if s.cfg.Quit == nil {
		http.Error(w, "shutdown is not wired", http.StatusServiceUnavailable)
		return
	}
	plain(w, http.StatusOK, "shutdown now\n")
	s.cfg.Quit()
}

func certDump(der []byte) CertDump {
	d := CertDump{PEM: base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
	if c, err := x509.ParseCertificate(der); err == nil {
		// Decimal, as ztunnel writes it and istioctl parses it.
		d.SerialNumber = c.SerialNumber.String()
		d.ValidFrom = c.NotBefore.UTC().Format(time.RFC3339)
		d.ExpirationTime = c.NotAfter.UTC().Format(time.RFC3339)
	}
	return d
}
