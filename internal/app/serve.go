package app

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/ztunnel-go/ztunnel/dnsproxy"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/proxy"
)

// listenerVar names the variable that sets each admin-side listener's
// address, for errors.
var listenerVar = map[string]string{"admin": "ZTUNNEL_ADMIN_ADDR", "stats": "ZTUNNEL_STATS_ADDR", "readiness": "ZTUNNEL_READINESS_ADDR"}

// closedChan returns a channel that is already closed.
func closedChan() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// serveWhenSynced runs start once synced is closed, then done (the
// readiness task it completes). It runs start inline when synced is
// already closed, so a daemon on a local config alone reports a listener
// that cannot open as a Start error; otherwise start runs on a background
// goroutine and its error stops the daemon (Failed). start never runs after
// Close has begun. The error is start's when it ran inline.
func (d *Daemon) serveWhenSynced(synced <-chan struct{}, start func() error, done func()) error {
	run := func() error {
		d.serveMu.Lock()
		closing := d.closing
		d.serveMu.Unlock()
		if closing {
			return nil
		}
		if err := start(); err != nil {
			return err
		}
		done()
		return nil
	}
	select {
	case <-synced:
		return run()
	default:
	}
	d.log.Info("waiting for the control plane to sync Address and Authorization before serving", "scope", "xds")
	d.bgWG.Go(func() {
		select {
		case <-synced:
		case <-d.bg.Done():
			return
		}
		if err := run(); err != nil {
			d.log.Error("cannot serve after the state synced", "error", err)
			d.fail(err)
		}
	})
	return nil
}

// startDedicated opens the dedicated workload's listeners (and its DNS
// proxy) and records them for Drain and Close.
func (d *Daemon) startDedicated(ctx context.Context, p *proxy.Proxy, srv *dnsproxy.Server) error {
	w := d.cfg.Workload
	return d.startServed(ctx, p, srv, identity.New(d.cfg.TrustDomain, w.Namespace, w.ServiceAccount))
}

// startServed starts p (then srv, if any) unless Close has begun, records
// them for Drain and Close, and counts id, the identity p serves, in the
// certificate warmer: its certificate is fetched before the first
// connection asks.
func (d *Daemon) startServed(ctx context.Context, p *proxy.Proxy, srv *dnsproxy.Server, id identity.Identity) error {
	d.serveMu.Lock()
	defer d.serveMu.Unlock()
	if d.closing {
		return nil
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	d.proxies = append(d.proxies, p)
	d.warm.podUp(id)
	if srv != nil {
		if err := srv.Start(ctx); err != nil {
			return fmt.Errorf("dns proxy: %w", err)
		}
		d.dns = append(d.dns, srv)
	}
	return nil
}

// fail makes the daemon exit 1 with err (Failed, Err); the first call wins.
func (d *Daemon) fail(err error) {
	d.failOnce.Do(func() {
		d.failErr = err
		close(d.failed)
	})
}

// selfProxy builds (unstarted) the daemon's self-proxy when its own pod is
// known (POD_NAME, POD_NAMESPACE and SERVICE_ACCOUNT, from the chart's
// downward API) in shared mode: HBONE on 15008 in the daemon's own network
// namespace, with the daemon's own identity, so that a mesh client (a
// Prometheus in the mesh) reaches 15020 over mTLS, as ztunnel's self-proxy
// allows. It dials its target from its own address (no original-source
// spoofing: the target is the daemon itself). Nil without the three
// variables.
func (d *Daemon) selfProxy(proxyConfig func(proxy.WorkloadRef, func(func() error) error) proxy.Config) (*proxy.Proxy, error) {
	c := d.cfg
	if c.Mode != ModeShared || c.PodName == "" || c.PodNamespace == "" || c.ServiceAccount == "" {
		return nil, nil
	}
	pc := proxyConfig(c.workloadRef(c.PodNamespace, c.PodName, c.ServiceAccount), nil)
	pc.InboundOnly = true
	off := false
	pc.OrigSrc = &off
	pc.SOCKS5 = false
	p, err := proxy.New(pc)
	if err != nil {
		return nil, fmt.Errorf("self-proxy: %w", err)
	}
	return p, nil
}

// startSelfProxy starts the self-proxy and counts its identity among the
// served ones, like a pod's.
func (d *Daemon) startSelfProxy(ctx context.Context, p *proxy.Proxy) error {
	id := identity.New(d.cfg.TrustDomain, d.cfg.PodNamespace, d.cfg.ServiceAccount)
	if err := d.startServed(ctx, p, nil, id); err != nil {
		return fmt.Errorf("self-proxy: %w", err)
	}
	d.log.Info("serving HBONE for the daemon's own pod", "workload", d.cfg.PodNamespace+"/"+d.cfg.PodName, "identity", id.String())
	return nil
}

// watchLocalWorkload completes done, the readiness task "local workload"
// of a dedicated daemon, once the synced state holds the workload it
// serves (PROXY_WORKLOAD_INFO). A workload absent then is said at once: a
// warning naming it, and readiness pending until it appears, for every
// connection meanwhile waits for it (proxy.Config.LocalWorkloadWait) and
// then fails.
func (d *Daemon) watchLocalWorkload(synced <-chan struct{}, ref proxy.WorkloadRef, done func()) {
	info := ref.Info()
	d.bgWG.Go(func() {
		select {
		case <-synced:
		case <-d.bg.Done():
			return
		}
		warned := false
		for {
			changed := d.store.Changed()
			if d.store.Load().FindWorkload(info) != nil {
				if warned {
					d.log.Info("local workload found in the state", "workload", ref.String())
				}
				done()
				return
			}
			if !warned {
				warned = true
				d.log.Warn("local workload not found in the state: its connections will fail until it appears (PROXY_WORKLOAD_INFO)",
					"workload", ref.String())
			}
			select {
			case <-changed:
			case <-d.bg.Done():
				return
			}
		}
	})
}

// addrList is a server's addresses for the log: localhost's two loopbacks
// (ztunnel's Address::Localhost) as "127.0.0.1:15000,[::1]:15000".
func addrList(addrs []net.Addr) string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return strings.Join(out, ",")
}
