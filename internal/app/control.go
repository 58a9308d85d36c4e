package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/ztunnel-go/ztunnel/controlplane"
	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
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

// signer is where workload certificates come from, with its cleanup.
type signer struct {
	caclient.Signer
	close func()
}

// newSigner returns the built-in CA (FAKE_CA, or a local config without
// CA_ADDRESS) or the Istio CA client.
func newSigner(cfg *Config) (signer, error) {
	if cfg.FakeCA {
		ca, err := builtinCA(cfg)
		return signer{ca, func() {}}, err
	}
	token, tokenPath := authToken(cfg.AuthToken)
	headers, err := controlplane.HeadersFromEnv(os.Environ(), "CA_HEADER_")
	if err != nil {
		return signer{}, err
	}
	ca, err := caclient.NewIstioCA(caclient.IstioCAConfig{
		Address: cfg.CAAddress, RootCA: cfg.CARootCA, AltHostname: cfg.AltCAHostname,
		Token: token, TokenPath: tokenPath, ClusterID: cfg.ClusterID, Headers: headers,
		DialOptions: markedDialer(cfg), CurvePreferences: controlPlaneCurves(cfg), // env_compat.go
	})
	if err != nil {
		return signer{}, fmt.Errorf("CA_ADDRESS=%s: %w", cfg.CAAddress, err)
	}
	return signer{ca, func() { ca.Close() }}, nil
}

// authToken interprets AUTH_TOKEN as ztunnel does: a file when one exists at
// that path, else a static token; unset means the projected token file when
// it exists, else no token.
func authToken(v string) (token, path string) {
	if v == "" {
		if _, err := os.Stat(defaultTokenPath); err == nil {
			return "", defaultTokenPath
		}
		return "", ""
	}
	if _, err := os.Stat(v); err == nil {
		return "", v
	}
	return v, ""
}

// newXDSClient builds the delta-ADS client from XDS_* and the node identity;
// it feeds m's istio_xds_* families.
func newXDSClient(cfg *Config, log *slog.Logger, m *metrics.Metrics) (*xdsclient.Client, error) {
	token, tokenPath := authToken(cfg.AuthToken)
	headers, err := controlplane.HeadersFromEnv(os.Environ(), "XDS_HEADER_")
	if err != nil {
		return nil, err
	}
	meta := proxyMetadata(os.Environ(), nil)
	info := xdsclient.NodeInfoFromEnv(os.Environ(), meta)
	info.InstanceIP, info.PodName, info.PodNamespace, info.NodeName = cfg.InstanceIP, cfg.PodName, cfg.PodNamespace, cfg.NodeName
	node, errs := xdsclient.NewNode(info)
	if len(errs) > 0 {
		return nil, fmt.Errorf("xds node metadata: %w", errors.Join(errs...))
	}
	var onDemand []string
	if cfg.XDSOnDemand {
		onDemand = []string{xdsconv.AddressType}
	}
	return xdsclient.New(xdsclient.Config{
		Address: cfg.XDSAddress, RootCA: cfg.XDSRootCA, AltHostname: cfg.AltXDSHostname,
		Token: token, TokenPath: tokenPath, ClusterID: cfg.ClusterID, Headers: headers,
		Node: node, OnDemandTypes: onDemand, DialOptions: markedDialer(cfg), CurvePreferences: controlPlaneCurves(cfg),
		Logf:          xdsLogf(log),
		OnMessage:     m.XDSMessage,
		OnTermination: func(reason string) { m.XDSConnectionTerminated(metrics.XDSTermination(reason)) },
	}), nil
}

// markedDialer makes control-plane connections carry PACKET_MARK, so that a
// daemon inside a captured namespace (dedicated mode in a pod) reaches istiod
// directly instead of through its own capture rules.
func markedDialer(cfg *Config) []grpc.DialOption {
	if cfg.PacketMark == 0 {
		return nil
	}
	d := &net.Dialer{Timeout: 5 * time.Second, Control: engine.SocketOptions{Mark: cfg.PacketMark}.DialControl()}
	return []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", addr)
	})}
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
