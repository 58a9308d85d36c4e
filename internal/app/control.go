package app

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/ztunnel-go/ztunnel/proxy"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
	"github.com/ztunnel-go/ztunnel/xdsclient"
)

// xdsLogf logs the xDS client's events under scope "xds" at the levels it
// gives them (ztunnel's: connection errors warn, NACKs error).
func xdsLogf(log *slog.Logger) func(slog.Level, string, ...any) {
	return func(l slog.Level, f string, a ...any) {
		log.Log(context.Background(), l, fmt.Sprintf(f, a...), "scope", "xds")
	}
}

// onDemandLookup is the proxies' on-demand fetch with XDS_ON_DEMAND: an
// Address lookup by ztunnel's "network/IP" key on the xDS stream. Nil (no
// lookups) without it or without a control plane.
func onDemandLookup(xc *xdsclient.Client, cfg *Config) proxy.Demand {
	if xc == nil || !cfg.XDSOnDemand {
		return nil
	}
	return func(ctx context.Context, name string) error { return xc.Lookup(ctx, xdsconv.AddressType, name) }
}
