package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel/admin"
	"github.com/ztunnel-go/ztunnel/dnsproxy"
	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/inpod"
	"github.com/ztunnel-go/ztunnel/internal/logging"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/proxy"
	"github.com/ztunnel-go/ztunnel/proxy/connmgr"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
	"github.com/ztunnel-go/ztunnel/xdsclient"
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
	workers   *proxy.Workers // shared mode: the pods' connection workers; closed after the proxies
	engine    *engine.Engine // relays of every proxy; closed after them
	proxies   []*proxy.Proxy
	dns       []*dnsproxy.Server // dedicated mode's DNS proxy
	admin     *admin.HTTPServer
	stats     *admin.HTTPServer
	readiness *admin.HTTPServer
	quit      chan struct{}
	// bg is the context of the daemon's background goroutines (xDS client,
	// connection manager); stopBG ends it and bgWG waits for them.
	bg          context.Context
	stopBG      context.CancelFunc
	bgWG        sync.WaitGroup
	closeSigner func()
	// warm keeps the served identities' certificates fetched ahead of
	// their first connection.
	warm *certWarmer
	// inpod is shared mode's workload manager, set once Start has made it
	// (the admin server may ask for its state before).
	inpod atomic.Pointer[inpod.Manager]
	// crl is CRL_PATH's revocation list, set by startCRL (nil without one).
	crl atomic.Pointer[mtls.CRL]
	// serveMu guards proxies and dns, which the goroutine that starts
	// serving once the state is synced fills while Drain or Close may run.
	serveMu sync.Mutex
	closing bool // set by Close: nothing more may start serving
	// failed is closed (once, by fail) when the daemon must exit 1 for a
	// reason of its own, such as a listener that cannot open once the
	// state has synced; failErr says why.
	failed   chan struct{}
	failOnce sync.Once
	failErr  error
}

// Start builds and starts the daemon. Configuration errors are returned
// before any listener opens.
func Start(ctx context.Context, cfg *Config, log *slog.Logger, levels *logging.Levels) (*Daemon, error) {
	local := cfg.LocalXDSPath != "" || cfg.LocalXDS != ""
	if !local && cfg.XDSAddress == "" {
		return nil, errors.New("no configuration source: set XDS_ADDRESS, LOCAL_XDS_PATH or LOCAL_XDS")
	}
	var (
		lc   *xdsconv.LocalConfig
		snap *state.Snapshot
		err  error
	)
	if local {
		data := []byte(cfg.LocalXDS)
		if cfg.LocalXDSPath != "" {
			if data, err = os.ReadFile(cfg.LocalXDSPath); err != nil {
				return nil, fmt.Errorf("LOCAL_XDS_PATH: %w", err)
			}
		}
		if lc, err = xdsconv.ParseLocalConfig(data); err != nil {
			return nil, err
		}
		if snap, err = lc.Snapshot(); err != nil {
			return nil, err
		}
	}
	d := &Daemon{cfg: cfg, log: log, quit: make(chan struct{}), failed: make(chan struct{})}
	d.bg, d.stopBG = context.WithCancel(context.WithoutCancel(ctx))
	logStart(log, cfg, daemonBuildInfo(cfg))
	// Before the xDS client, which feeds the istio_xds_* families.
	m := metrics.New(metrics.Config{IstioVersion: cfg.IstioVersion})

	// Workloads, services and policies: the local config alone, or xDS
	// (combined with the local config when both are set).
	var xc *xdsclient.Client
	if cfg.XDSAddress != "" {
		d.store = state.NewStore(nil)
		xs, err := xdsconv.NewXDSState(d.store, lc, func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...), "scope", "xds") })
		if err != nil {
			return nil, err
		}
		if xc, err = newXDSClient(cfg, log, m); err != nil {
			return nil, err
		}
		xs.Register(xc)
	} else {
		d.store = state.NewStore(snap)
	}

	signer, err := newSigner(cfg)
	if err != nil {
		return nil, err
	}
	d.closeSigner = signer.close
	d.certs = mtls.NewStore(mtls.StoreConfig{
		// Shared mode asks for each pod's identity, not the daemon's own.
		Source: caclient.New(caclient.Config{Signer: signer.Signer, TTL: cfg.SecretTTL, Impersonate: cfg.Mode == ModeShared}),
		// The store logs only failed refreshes: warnings, as ztunnel's.
		Logf: func(f string, a ...any) { log.Warn(fmt.Sprintf(f, a...), "scope", "identity") },
	})
	store, certs := d.store, d.certs
	d.warm = newCertWarmer(certs, cfg, log)
	d.bgWG.Go(func() { d.warm.run(d.bg, store) })

	h2 := hbone.Config{
		StreamWindow: cfg.StreamWindow, ConnWindow: cfg.ConnectionWindow, MaxFrameSize: cfg.FrameSize,
	}
	if d.engine, err = newEngine(cfg, log); err != nil { // engine.go
		d.Close()
		return nil, err
	}
	eng := d.engine
	// Both directions' HBONE connections are the engine's loops' where
	// the backend can own them (epoll, over mtls/record): the pool's and
	// the inbound servers' (h2 goes to every proxy's Config.HBONE). The
	// rest keep hbone's goroutine driver.
	h2.Drive = proxy.LoopDrive(eng)
	poolCfg := hbone.PoolConfig{Config: h2, MaxStreamsPerConn: cfg.PoolMaxStreams, IdleTimeout: cfg.PoolUnusedRelease}
	poolCfg.Config.Logf = func(f string, a ...any) { log.Debug(fmt.Sprintf(f, a...), "scope", "hbone") }
	poolCfg.Config.Admit = proxy.AdmitOutbound(d.crl.Load, log, m) // the CRL, once startCRL has loaded it
	d.pool = hbone.NewPool(poolCfg)
	if cfg.Mode == ModeShared {
		d.workers = proxy.NewWorkers()
	}

	ready := admin.NewReadiness()
	proxyDone := ready.Register("proxy")
	// synced is closed once the state the proxies decide from is known:
	// at once for a local config alone, else when every xDS type that is
	// not on demand (Address and Authorization) has been received and
	// ACKed. Nothing serves workload traffic before it (see serveWhenSynced).
	synced := closedChan()
	if xc != nil {
		synced = xc.Synced()
		// Not ready until both resource types are warm and ACKed.
		stateDone := ready.Register("state manager")
		d.bgWG.Go(func() {
			if err := xc.Run(d.bg); err != nil && !errors.Is(err, context.Canceled) {
				log.Error("xds client stopped", "error", err, "scope", "xds")
			}
		})
		d.bgWG.Go(func() {
			select {
			case <-xc.Synced():
				stateDone()
				log.Info("xds synced", "scope", "xds")
			case <-d.bg.Done():
			}
		})
	}
	// The three servers count their refused connections in m; their
	// limits are admin's defaults.
	refused := func(name string, r admin.RefusalReason) { m.AdminConnRefused(name, string(r)) }
	// A listener that cannot open is reported under the variable that
	// names its address.
	serve := func(name, addr string, h http.Handler) (*admin.HTTPServer, error) {
		s, err := admin.Serve(admin.ServeConfig{Name: name, Addr: addr, IPv4Only: !cfg.IPv6Enabled, Handler: h, Logger: log, OnRefused: refused})
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %w", listenerVar[name], addr, err)
		}
		return s, nil
	}
	if d.readiness, err = serve("readiness", cfg.ReadinessAddr, ready); err != nil {
		d.Close()
		return nil, err
	}
	crl, err := d.startCRL(m, signer.rootPEM()) // crl.go
	if err != nil {
		d.Close()
		return nil, err
	}
	if d.stats, err = serve("stats", cfg.StatsAddr, admin.NewMetricsHandler(m.Gatherer(), log)); err != nil {
		d.Close()
		return nil, err
	}
	admCfg := admin.Config{
		State: store, Certs: certs, DaemonConfig: liveView{cfg}, Version: daemonBuildInfo(cfg), Logger: log,
		StaticConfig: snap, // nil without a local config
		Quit:         d.requestQuit,
		Logging:      levels,
		Engine:       func() admin.EngineDump { return engineDump(eng) },
	}
	if cfg.Mode == ModeShared {
		admCfg.WorkloadState = func() map[string]admin.WorkloadStateDump { return workloadStateDump(d.inpod.Load()) }
	}
	adm := admin.NewServer(admCfg)
	if d.admin, err = serve("admin", cfg.AdminAddr, adm); err != nil {
		d.Close()
		return nil, err
	}

	// The connection manager re-checks open inbound connections when an
	// Authorization push changes the policies, and closes the denied ones.
	conns := connmgr.New(connmgr.Config{Store: store, Logf: func(f string, a ...any) {
		log.Info(fmt.Sprintf(f, a...), "scope", "access")
	}})
	d.bgWG.Go(func() { conns.Run(d.bg) })

	sock := engine.SocketOptions{Mark: cfg.PacketMark, UserTimeout: userTimeout(cfg)}
	if cfg.KeepAliveEnabled {
		sock.KeepAlive = engine.KeepAlive{Idle: cfg.KeepAliveTime, Interval: cfg.KeepAliveInterval, Count: cfg.KeepAliveRetries}
	}
	resolver := onDemandResolver(cfg, log) // dns.go
	budget := newBudget(cfg, eng, log)     // budget.go
	proxyConfig := func(w proxy.WorkloadRef, control func(fn func() error) error) proxy.Config {
		return proxy.Config{
			Workload:    w,
			TrustDomain: cfg.TrustDomain,
			Network:     cfg.Network,
			State:       store,
			Certs:       certs,
			Pool:        d.pool,
			Engine:      eng,
			HBONE:       h2,
			Socket:      sock,
			ReusePort:   reusePort(cfg), // env_compat.go
			// A node's pods are many and nearly all quiet: their listeners
			// wait on the engine's one watcher, not a goroutine each.
			WatchListeners: cfg.Mode == ModeShared,
			Workers:        d.workers, // nil outside shared mode
			OrigSrc:        cfg.OrigSrc,
			Control:        control,
			Logger:         log,
			Metrics:        m,
			Conns:          conns,
			CRL:            crl,
			Budget:         budget,

			MaxHBONEHandshakesPerPeer: cfg.HBONEMaxHandshakesPerPeer,
			MaxHBONEConnsPerPeer:      cfg.HBONEMaxConnsPerPeer,

			PreferredServiceNamespace: cfg.PreferredServiceNamespace,
			SOCKS5:                    cfg.EnableSOCKS5,
			DirectAppTunnel:           !cfg.LocalhostAppTunnel,
			PoolInnerHBONE:            cfg.PoolInnerHBONE,
			OnDemand:                  onDemandLookup(xc, cfg), // control.go
			TLS:                       mtls.Policy{PQC: cfg.PQC},
			PolicyInfoLogging:         cfg.PolicyInfoLogging,
			BindHost:                  bindHost(cfg), // env_compat.go
			Resolver:                  resolver,
		}
	}
	newProxy := func(w proxy.WorkloadRef, control func(fn func() error) error) (*proxy.Proxy, error) {
		return proxy.New(proxyConfig(w, control))
	}
	var dnsf *dnsFactory
	if cfg.DNSCapture {
		dnsf = newDNSFactory(cfg, store, m, log)
		dnsf.budget = budget
		if cfg.Mode == ModeShared {
			dnsf.watch = eng.WatchReadable // as the proxies' listeners (WatchListeners)
		}
	}
	if cfg.Mode == ModeShared {
		deps := sharedDeps{Log: log, Ready: ready, Metrics: m, UDS: cfg.InpodUDS, NewProxy: newProxy, Warm: d.warm.wrap}
		if dnsf != nil {
			deps.NewDNS = dnsf.build
		}
		// The manager is made now (privilege checks fail the start) but
		// connects to the CNI agent only once the state is synced: until
		// then no pod's snapshot is acknowledged and no pod listener opens,
		// as in ztunnel, so no connection is decided on a partial state.
		mgr, err := startShared(ctx, cfg, deps)
		if err != nil {
			d.Close()
			return nil, err
		}
		d.inpod.Store(mgr)
		d.bgWG.Go(func() {
			select {
			case <-mgr.Done():
				if err := mgr.Err(); err != nil { // a ZDS protocol error: ztunnel exits 1
					d.fail(err)
				}
			case <-d.bg.Done():
			}
		})
		self, err := d.selfProxy(proxyConfig)
		if err != nil {
			d.Close()
			return nil, err
		}
		_ = d.serveWhenSynced(synced, func() error {
			if self != nil {
				if err := d.startSelfProxy(ctx, self); err != nil {
					return err
				}
			}
			mgr.Start()
			return nil
		}, proxyDone)
	} else {
		ref := cfg.workloadRef(cfg.Workload.Namespace, cfg.Workload.Name, cfg.Workload.ServiceAccount)
		p, err := newProxy(ref, nil)
		if err != nil {
			d.Close()
			return nil, err
		}
		var srv *dnsproxy.Server
		if dnsf != nil {
			if srv, err = dnsf.build(ref, nil); err != nil {
				d.Close()
				return nil, err
			}
		}
		// Built now, listening only once the state is synced: a listener
		// that accepted before would decide on a state without policies,
		// and with SO_REUSEPORT it would take connections from a synced
		// daemon it replaces.
		if err := d.serveWhenSynced(synced, func() error { return d.startDedicated(ctx, p, srv) }, proxyDone); err != nil {
			d.Close()
			return nil, err
		}
		d.watchLocalWorkload(synced, ref, ready.Register("local workload"))
	}
	cfg.Engine = eng.Backend()
	log.Info("ztunnel-go started", "mode", string(cfg.Mode), "engine", cfg.Engine, "workload", cfg.Workload.Namespace+"/"+cfg.Workload.Name,
		"workloads", len(store.Load().Workloads()), "services", len(store.Load().Services()), "policies", len(store.Load().Policies()),
		"xds", cfg.XDSAddress,
		"admin", addrList(d.admin.Addrs()), "readiness", d.readiness.Addr().String())
	return d, nil
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
	return stamp(bi)
}

func (d *Daemon) requestQuit() {
	select {
	case <-d.quit:
	default:
		close(d.quit)
	}
}

// Failed is closed when the daemon must stop and exit 1: in shared mode, a
// ZDS protocol error (ztunnel exits on it); in either mode, listeners that
// cannot open once the state has synced. Err says why.
func (d *Daemon) Failed() <-chan struct{} { return d.failed }

// Err is the reason Failed was closed.
func (d *Daemon) Err() error {
	select {
	case <-d.failed:
		return d.failErr
	default:
		return nil
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
	d.serveMu.Lock()
	d.closing = true // nothing more starts serving
	proxies, dns := d.proxies, d.dns
	d.serveMu.Unlock()
	// As ztunnel's admin, stats and readiness servers (hyper_util.rs
	// serve: take_until(drain), then graceful_shutdown): they stop
	// accepting now (readiness probes fail from here), idle keep-alive
	// connections close, and requests in flight get the grace period, in
	// parallel with the proxies' drain.
	var web sync.WaitGroup
	for _, s := range []*admin.HTTPServer{d.admin, d.stats, d.readiness} {
		if s != nil {
			web.Go(func() { _ = s.Shutdown(ctx) })
		}
	}
	if m := d.inpod.Load(); m != nil {
		m.Drain(ctx) // every pod's proxy, in parallel
	}
	for _, s := range dns {
		s.Drain(ctx)
	}
	for _, p := range proxies {
		p.Drain(ctx)
	}
	// The proxies' outbound streams have ended: the pooled HBONE
	// connections get their GOAWAY and close cleanly. Before the engine's
	// drain, which waits for the loop-owned ones among them to end.
	if d.pool != nil {
		_ = d.pool.Shutdown(ctx)
	}
	// The engine last: the proxies have ended or aborted their relays; any
	// left get what remains of the grace period.
	if d.engine != nil {
		_ = d.engine.Drain(ctx)
	}
	web.Wait() // before Close, which would cut their requests at once
	d.log.Info("drain complete", "duration", time.Since(start).Round(time.Millisecond).String())
	d.Close()
}

// Close stops everything without a grace period.
func (d *Daemon) Close() {
	d.serveMu.Lock()
	d.closing = true
	proxies, dns := d.proxies, d.dns
	d.serveMu.Unlock()
	if m := d.inpod.Load(); m != nil {
		m.Close()
	}
	for _, s := range dns {
		s.Close()
	}
	for _, p := range proxies {
		p.Close()
	}
	if d.workers != nil {
		d.workers.Close() // after the proxies, whose connections its workers served
	}
	if d.engine != nil {
		_ = d.engine.Close() // after the proxies; ErrClosed after Drain
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
	if d.stopBG != nil {
		d.stopBG()
		d.bgWG.Wait()
	}
	if d.warm != nil {
		d.warm.close()
	}
	if d.closeSigner != nil {
		d.closeSigner()
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
