// Package controlplane dials gRPC connections to the Istio control plane
// (istiod's xDS and CA endpoints) the way ztunnel does: HTTP/2 over TLS with
// server authentication only, the server name checked against the address's
// host or an alternative name, roots from a file (re-read when it changes), the
// system pool or inline PEM, and on every call the JWT bearer token (re-read
// from its file), the clusterid header and any extra headers.
//
// Imports (of ours): nothing of ours. Imported by: internal/app, mtls/caclient
// and xdsclient.
package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// SystemRoots is the RootCA value that selects the operating system's roots.
const SystemRoots = "SYSTEM"

// Connection settings, as ztunnel's control-plane channel uses them.
const (
	connectTimeout    = 5 * time.Second
	keepaliveTime     = 30 * time.Second // HTTP/2 PING interval
	keepaliveTimeout  = 10 * time.Second
	tcpKeepaliveIdle  = 300 * time.Second
	tcpKeepaliveIntvl = 75 * time.Second
	tcpKeepaliveCount = 9
)

// Config says where the control plane is and how to authenticate to it.
type Config struct {
	// Address is the server URL, "https://host:port"; without a scheme,
	// https:// is assumed (as ztunnel does). Only https is accepted. Required.
	Address string
	// RootCA verifies the server: the path of an existing PEM file (read
	// again whenever it changes), SystemRoots, or else inline PEM. Empty means
	// the system roots.
	RootCA string
	// AltHostname is a second name the server's certificate may carry when it
	// does not match the address's host (ALT_XDS_HOSTNAME, ALT_CA_HOSTNAME).
	AltHostname string
	// TokenPath is a file holding the JWT sent as "authorization: Bearer
	// <token>" on every call. It is read for each call, so a rotated token is
	// picked up without a restart; an empty file fails the call.
	TokenPath string
	// Token is a static JWT, used when TokenPath is empty. With neither set
	// no authorization or clusterid header is sent.
	Token string
	// ClusterID is sent as the clusterid header alongside the token.
	ClusterID string
	// Headers are extra metadata sent on every call (XDS_HEADER_*,
	// CA_HEADER_*). Keys are lower-cased, as HTTP/2 requires. Entries named
	// authorization or clusterid are overridden by the token headers.
	Headers map[string]string
	// CurvePreferences, when set, are the only TLS key exchanges offered
	// (COMPLIANCE_POLICY=pqc: X25519MLKEM768); nil is Go's default.
	CurvePreferences []tls.CurveID
}

// Dial returns a client connection for cfg. Like grpc.NewClient it does not
// connect until the first call. It fails on an unusable address or on inline
// or system roots that do not load; a root file is only read at each
// handshake, so one that is missing or bad now fails the calls until it is
// fixed (CheckRoots says why). Callers add their own options (message size
// limits, interceptors) in opts.
func Dial(cfg Config, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	hostport, host, err := parseAddress(cfg.Address)
	if err != nil {
		return nil, err
	}
	roots := &rootSource{spec: cfg.RootCA}
	// A root file is read at every handshake: Kubernetes may mount it after
	// the daemon starts, or rotate it, and a missing or bad file then fails
	// that handshake (retried by the caller), not the daemon. Inline PEM or
	// the system roots cannot get better: they fail now.
	if !roots.isFile() {
		if _, err := roots.pool(); err != nil {
			return nil, err
		}
	}
	tlsCfg := &tls.Config{
		MinVersion:       tls.VersionTLS13,
		ServerName:       host,
		CurvePreferences: cfg.CurvePreferences,
		// The chain and name are checked in VerifyConnection instead, so
		// that the roots can change between handshakes and the alternative
		// name can be tried.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyServer(cs, roots, host, cfg.AltHostname)
		},
	}
	headers := make(map[string]string, len(cfg.Headers)+2)
	for k, v := range cfg.Headers {
		headers[strings.ToLower(k)] = v
	}
	dialer := &net.Dialer{
		Timeout: connectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: tcpKeepaliveIdle, Interval: tcpKeepaliveIntvl, Count: tcpKeepaliveCount,
		},
	}
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithPerRPCCredentials(&callCreds{tokenPath: cfg.TokenPath, token: cfg.Token, clusterID: cfg.ClusterID, headers: headers}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr)
		}),
	}, opts...)
	// passthrough: the dialer resolves the name, as ztunnel's connector does.
	cc, err := grpc.NewClient("passthrough:///"+hostport, all...)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %s: %w", cfg.Address, err)
	}
	return cc, nil
}

// parseAddress returns host:port (default port 443) and the bare host.
func parseAddress(addr string) (hostport, host string, err error) {
	if addr == "" {
		return "", "", errors.New("controlplane: no address")
	}
	if !strings.Contains(addr, "://") {
		addr = "https://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return "", "", fmt.Errorf("controlplane: address %q: %w", addr, err)
	}
	if u.Scheme != "https" {
		return "", "", fmt.Errorf("controlplane: address %q: scheme %q, want https", addr, u.Scheme)
	}
	host = u.Hostname()
	if host == "" {
		return "", "", fmt.Errorf("controlplane: address %q has no host", addr)
	}
	if !validHost(host) {
		return "", "", fmt.Errorf("controlplane: address %q: host %q is neither an IP address nor a DNS name", addr, host)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	// url.Parse takes any digits as a port; refuse what no dial can use
	// now rather than on every reconnect (found by FuzzParseAddress).
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", "", fmt.Errorf("controlplane: address %q: port %q, want 1-65535", addr, port)
	}
	return net.JoinHostPort(host, port), host, nil
}

// validHost reports whether host is an IP address or made of DNS name
// characters; url.Parse lets through hosts such as "]" that no dial accepts
// (found by FuzzParseAddress).
func validHost(host string) bool {
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	for i := range len(host) {
		c := host[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// verifyServer checks the server's chain against the current roots and its
// name against host, then altHost.
func verifyServer(cs tls.ConnectionState, roots *rootSource, host, altHost string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("controlplane: server sent no certificate")
	}
	pool, err := roots.pool()
	if err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	leaf := cs.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter}); err != nil {
		return fmt.Errorf("controlplane: server certificate: %w", err)
	}
	err = leaf.VerifyHostname(host)
	if err != nil && altHost != "" {
		if altErr := leaf.VerifyHostname(altHost); altErr == nil {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("controlplane: server certificate: %w", err)
	}
	return nil
}

// rootSource yields the trust roots, re-reading a root file when its size or
// modification time changes.
type rootSource struct {
	spec string

	mu sync.Mutex // guards the following fields
	// cached is the pool last built from the file with this stat.
	cached  *x509.CertPool
	modTime time.Time
	size    int64
}

// isFile reports whether the roots come from a file (re-read as it changes)
// rather than inline PEM or the system pool.
func (r *rootSource) isFile() bool {
	return r.spec != "" && r.spec != SystemRoots && !strings.Contains(r.spec, "-----BEGIN")
}

// CheckRoots reports whether the roots spec (Config.RootCA) yields a usable
// pool now: for a file, whether it exists and holds a PEM certificate. Dial
// does not require it for a file, which may appear later; callers use it to
// say why a connection cannot be made before trying.
func CheckRoots(spec string) error {
	_, err := (&rootSource{spec: spec}).pool()
	return err
}

func (r *rootSource) pool() (*x509.CertPool, error) {
	switch {
	case r.spec == "" || r.spec == SystemRoots:
		p, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("controlplane: system roots: %w", err)
		}
		return p, nil
	case r.isFile():
		return r.filePool()
	}
	return parseRoots([]byte(r.spec), "inline root certificates")
}

func (r *rootSource) filePool() (*x509.CertPool, error) {
	fi, err := os.Stat(r.spec)
	if err != nil {
		return nil, fmt.Errorf("controlplane: root certificates: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cached != nil && fi.ModTime().Equal(r.modTime) && fi.Size() == r.size {
		return r.cached, nil
	}
	data, err := os.ReadFile(r.spec)
	if err != nil {
		return nil, fmt.Errorf("controlplane: root certificates: %w", err)
	}
	p, err := parseRoots(data, r.spec)
	if err != nil {
		return nil, err
	}
	r.cached, r.modTime, r.size = p, fi.ModTime(), fi.Size()
	return p, nil
}

func parseRoots(data []byte, what string) (*x509.CertPool, error) {
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("controlplane: %s: no PEM certificate found", what)
	}
	return p, nil
}

// callCreds adds the headers to every call.
type callCreds struct {
	tokenPath, token, clusterID string
	headers                     map[string]string
}

func (c *callCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	md := make(map[string]string, len(c.headers)+2)
	for k, v := range c.headers {
		md[k] = v
	}
	tok := c.token
	if c.tokenPath != "" {
		b, err := os.ReadFile(c.tokenPath)
		if err != nil {
			return nil, fmt.Errorf("controlplane: reading token: %w", err)
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return nil, fmt.Errorf("controlplane: token file %s exists, but is empty", c.tokenPath)
		}
		tok = strings.TrimSpace(string(b))
	}
	if tok != "" {
		md["authorization"] = "Bearer " + tok
		md["clusterid"] = c.clusterID
	}
	return md, nil
}

func (c *callCreds) RequireTransportSecurity() bool { return true }

// HeadersFromEnv returns the variables of environ ("KEY=value" entries, as
// os.Environ returns them) whose name starts with prefix, keyed by the rest
// of the name, lower-cased; ztunnel reads XDS_HEADER_* and CA_HEADER_* this
// way. Names and values must be valid HTTP/2 header text.
func HeadersFromEnv(environ []string, prefix string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		name, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		if !validHeaderName(name) {
			return nil, fmt.Errorf("controlplane: %s: invalid header name %q", k, name)
		}
		for i := range len(v) {
			if v[i] < 0x20 && v[i] != '\t' || v[i] >= 0x7f {
				return nil, fmt.Errorf("controlplane: %s: invalid header value", k)
			}
		}
		out[strings.ToLower(name)] = v
	}
	return out, nil
}

// validHeaderName reports whether s is an HTTP token (RFC 9110).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
