package app

import (
	"context"
	"fmt"

	"github.com/ztunnel-go/ztunnel/dnsproxy"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/proxy"
)

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
	d.serveMu.Lock()
	defer d.serveMu.Unlock()
	if d.closing {
		return nil
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	d.proxies = append(d.proxies, p)
	if d.warm != nil { // the one identity served: its certificate before the first connection asks
		w := d.cfg.Workload
		d.warm.podUp(identity.New(d.cfg.TrustDomain, w.Namespace, w.ServiceAccount))
	}
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
