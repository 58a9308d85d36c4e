package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/admin"
	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/internal/logging"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/proxy"
	"github.com/ztunnel-go/ztunnel/proxy/connmgr"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

// ErrUnsupported marks configurations this build cannot serve yet; the
// message says which variable to change.
var ErrUnsupported = errors.New("app: unsupported configuration")

// Daemon is a running ztunnel-go.
type Daemon struct {
	cfg       *Config
	log       *slog.Logger
	store     *state.Store
	certs     *mtls.Store
	pool      *hbone.Pool
	proxies   []*proxy.Proxy
	admin     *admin.HTTPServer
	stats     *admin.HTTPServer
	readiness *admin.HTTPServer
	quit      chan struct{}
	stopConns context.CancelFunc // ends the connection manager
	connsDone chan struct{}
}

// Start builds and starts the daemon. Configuration errors are returned
// before any listener opens.
func Start(ctx context.Context, cfg *Config, log *slog.Logger, levels *logging.Levels) (*Daemon, error) {
	switch {
	case cfg.Mode == ModeShared:
		return nil, fmt.Errorf("%w: PROXY_MODE=shared needs the in-pod (ZDS) support, which this build does not have yet; set PROXY_MODE=dedicated", ErrUnsupported)
	case cfg.LocalXDSPath == "" && cfg.LocalXDS == "":
		return nil, fmt.Errorf("%w: no LOCAL_XDS_PATH or LOCAL_XDS; the xDS client (XDS_ADDRESS) is not in this build yet", ErrUnsupported)
	case cfg.XDSAddress != "":
		return nil, fmt.Errorf("%w: XDS_ADDRESS=%s: the xDS client is not in this build yet; unset it to use the local config alone", ErrUnsupported, cfg.XDSAddress)
	case !cfg.FakeCA:
		return nil, fmt.Errorf("%w: CA_ADDRESS=%s: the Istio CA client is not in this build yet; set FAKE_CA=true", ErrUnsupported, cfg.CAAddress)
	}

	data := []byte(cfg.LocalXDS)
	if cfg.LocalXDSPath != "" {
		var err error
		if data, err = os.ReadFile(cfg.LocalXDSPath); err != nil {
			return nil, fmt.Errorf("LOCAL_XDS_PATH: %w", err)
		}
	}
	lc, err := xdsconv.ParseLocalConfig(data)
	if err != nil {
		return nil, err
	}
	snap, err := lc.Snapshot()
	if err != nil {
		return nil, err
	}
	store := state.NewStore(snap)

	ca, err := builtinCA(cfg)
	if err != nil {
		return nil, err
	}
	certs := mtls.NewStore(mtls.StoreConfig{
		Source: caclient.New(caclient.Config{Signer: ca, TTL: cfg.SecretTTL}),
		Logf:   func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...), "scope", "identity") },
	})

	h2 := hbone.Config{
		StreamWindow: cfg.StreamWindow, ConnWindow: cfg.ConnectionWindow, MaxFrameSize: cfg.FrameSize,
	}
	poolCfg := hbone.PoolConfig{Config: h2, MaxStreamsPerConn: cfg.PoolMaxStreams, IdleTimeout: cfg.PoolUnusedRelease}
	poolCfg.Config.Logf = func(f string, a ...any) { log.Debug(fmt.Sprintf(f, a...), "scope", "hbone") }
	d := &Daemon{cfg: cfg, log: log, store: store, certs: certs, pool: hbone.NewPool(poolCfg), quit: make(chan struct{})}

	ready := admin.NewReadiness()
	proxyDone := ready.Register("proxy")
	if d.readiness, err = admin.Serve(cfg.ReadinessAddr, ready, log); err != nil {
		d.Close()
		return nil, err
	}
	m := metrics.New(metrics.Config{IstioVersion: cfg.IstioVersion})
	if d.stats, err = admin.Serve(cfg.StatsAddr, admin.NewMetricsHandler(m.Gatherer(), log), log); err != nil {
		d.Close()
		return nil, err
	}
	adm := admin.NewServer(admin.Config{
		State: store, Certs: certs, DaemonConfig: cfg, Version: buildInfo(), Logger: log,
		StaticConfig: snap,
		Quit:         d.requestQuit,
		Logging:      levels,
	})
	if d.admin, err = admin.Serve(cfg.AdminAddr, adm, log); err != nil {
		d.Close()
		return nil, err
	}

	// The connection manager re-checks open inbound connections when an
	// Authorization push changes the policies, and closes the denied ones.
	conns := connmgr.New(connmgr.Config{Store: store, Logf: func(f string, a ...any) {
		log.Info(fmt.Sprintf(f, a...), "scope", "access")
	}})
	var cmCtx context.Context
	cmCtx, d.stopConns = context.WithCancel(context.Background())
	d.connsDone = make(chan struct{})
	go func() { defer close(d.connsDone); conns.Run(cmCtx) }()

	sock := engine.SocketOptions{Mark: cfg.PacketMark}
	if cfg.KeepAliveEnabled {
		sock.KeepAlive = engine.KeepAlive{Idle: cfg.KeepAliveTime, Interval: cfg.KeepAliveInterval, Count: cfg.KeepAliveRetries}
	}
	p, err := proxy.New(proxy.Config{
		Workload:    proxy.WorkloadRef{Namespace: cfg.Workload.Namespace, Name: cfg.Workload.Name, ServiceAccount: cfg.Workload.ServiceAccount},
		TrustDomain: cfg.TrustDomain,
		Network:     cfg.Network,
		State:       store,
		Certs:       certs,
		Pool:        d.pool,
		HBONE:       h2,
		Socket:      sock,
		ReusePort:   cfg.PortReuse,
		OrigSrc:     cfg.OrigSrc,
		Logger:      log,
		Metrics:     m,
		Conns:       conns,
	})
	if err != nil {
		d.Close()
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		d.Close()
		return nil, err
	}
	d.proxies = append(d.proxies, p)
	proxyDone()
	log.Info("ztunnel-go ready", "mode", string(cfg.Mode), "workload", cfg.Workload.Namespace+"/"+cfg.Workload.Name,
		"workloads", len(snap.Workloads()), "services", len(snap.Services()), "policies", len(snap.Policies()),
		"admin", d.admin.Addr().String(), "readiness", d.readiness.Addr().String())
	return d, nil
}

func builtinCA(cfg *Config) (*caclient.BuiltinCA, error) {
	if cfg.BuiltinCACert == "" {
		return caclient.NewBuiltinCA(cfg.TrustDomain)
	}
	certPEM, err := os.ReadFile(cfg.BuiltinCACert)
	if err != nil {
		return nil, fmt.Errorf("BUILTIN_CA_CERT: %w", err)
	}
	keyPEM, err := os.ReadFile(cfg.BuiltinCAKey)
	if err != nil {
		return nil, fmt.Errorf("BUILTIN_CA_KEY: %w", err)
	}
	ca, err := caclient.LoadBuiltinCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("BUILTIN_CA_CERT/BUILTIN_CA_KEY: %w", err)
	}
	return ca, nil
}

func buildInfo() admin.BuildInfo {
	bi := admin.BuildInfo{Version: "dev", BuildProfile: "release", BuildStatus: "Modified"}
	if info, ok := debug.ReadBuildInfo(); ok {
		bi.GoVersion = info.GoVersion
		if info.Main.Version != "" {
			bi.Version = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				bi.GitRevision = s.Value
			case "vcs.modified":
				if s.Value == "false" {
					bi.BuildStatus = "Clean"
				}
			}
		}
	}
	return bi
}

func (d *Daemon) requestQuit() {
	select {
	case <-d.quit:
	default:
		close(d.quit)
	}
}

// QuitRequested is closed when /quitquitquit asks the daemon to exit.
func (d *Daemon) QuitRequested() <-chan struct{} { return d.quit }

// Drain closes the listeners at once, lets connections finish within the
// termination deadline, then closes everything.
func (d *Daemon) Drain() {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.TerminationDeadline)
	defer cancel()
	start := time.Now()
	for _, p := range d.proxies {
		p.Drain(ctx)
	}
	d.log.Info("drain complete", "duration", time.Since(start).Round(time.Millisecond).String())
	d.Close()
}

// Close stops everything without a grace period.
func (d *Daemon) Close() {
	for _, p := range d.proxies {
		p.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if d.admin != nil {
		d.admin.Shutdown(ctx)
	}
	if d.readiness != nil {
		d.readiness.Shutdown(ctx)
	}
	if d.stats != nil {
		d.stats.Shutdown(ctx)
	}
	if d.stopConns != nil {
		d.stopConns()
		<-d.connsDone
	}
	if d.pool != nil {
		d.pool.Close()
	}
	if d.certs != nil {
		d.certs.Close()
	}
}

// Version is the daemon's version string.
func Version() string {
	bi := buildInfo()
	return fmt.Sprintf("ztunnel-go version=%s revision=%s go=%s status=%s", bi.Version, bi.GitRevision, bi.GoVersion, bi.BuildStatus)
}

// NewLogger builds the daemon's logger from LOG_FORMAT and RUST_LOG, and
// the live per-scope levels the admin /logging endpoint changes.
func NewLogger(w io.Writer, cfg *Config) (*slog.Logger, *logging.Levels, error) {
	levels, err := logging.NewLevels(cfg.LogLevel)
	if err != nil {
		return nil, nil, fmt.Errorf("RUST_LOG: %w", err)
	}
	return logging.New(w, logging.Options{Format: cfg.LogFormat, Levels: levels}), levels, nil
}

// RaiseFileLimit lifts RLIMIT_NOFILE to its hard limit, as ztunnel does on
// start: a node proxy holds two descriptors per proxied connection.
func RaiseFileLimit() {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
}
