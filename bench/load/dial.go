package load

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/mtls/record"
)

// Conn is a connection of any transport the load modes use: a TCP
// connection, a TLS connection or an HBONE stream.
type Conn interface {
	net.Conn
	// CloseWrite half-closes: the server reads EOF.
	CloseWrite() error
}

// Transport names how a client reaches the server.
type Transport string

// The transports.
const (
	// TCP is a plain TCP connection per Dial.
	TCP Transport = "tcp"
	// TLS is a mutual TLS 1.3 connection per Dial (a full handshake each
	// time: the configs disable resumption).
	TLS Transport = "tls"
	// HBONE is an HTTP/2 CONNECT stream per Dial, on pooled mTLS connections.
	HBONE Transport = "hbone"
)

// DialConfig configures a Dialer.
type DialConfig struct {
	// Target is the address to connect to: the server, a proxy, or for HBONE
	// the peer's 15008.
	Target string
	// Transport is TCP (default), TLS or HBONE.
	Transport Transport
	// Authority is the HBONE CONNECT target ("ip:port"); required for HBONE.
	Authority string
	// Cert is the client's certificate; required for TLS and HBONE.
	Cert *mtls.WorkloadCert
	// SANs are the SPIFFE identities the server may present (TLS, HBONE).
	SANs []string
	// Timeout bounds one dial (TCP connect, TLS handshake, CONNECT).
	// Default 10s.
	Timeout time.Duration
	// StreamsPerConn caps the HBONE streams per pooled connection. Default
	// 100, ztunnel's POOL_MAX_STREAMS_PER_CONNECTION.
	StreamsPerConn int
	// NetDialer, if set, makes the TCP connections (for a LocalAddr or a
	// Control function). Nil means a plain net.Dialer.
	NetDialer *net.Dialer
}

// Dialer opens connections to one target. It is safe for concurrent use.
type Dialer struct {
	cfg  DialConfig
	tls  *tls.Config
	pool *hbone.Pool
}

// NewDialer checks cfg and returns a Dialer. Close it to release pooled
// HBONE connections.
func NewDialer(cfg DialConfig) (*Dialer, error) {
	if cfg.Target == "" {
		return nil, errors.New("load: no target")
	}
	if _, _, err := net.SplitHostPort(cfg.Target); err != nil {
		return nil, fmt.Errorf("load: target %q: %w", cfg.Target, err)
	}
	if cfg.Transport == "" {
		cfg.Transport = TCP
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.NetDialer == nil {
		cfg.NetDialer = &net.Dialer{}
	}
	d := &Dialer{cfg: cfg}
	switch cfg.Transport {
	case TCP:
	case TLS, HBONE:
		if cfg.Cert == nil {
			return nil, fmt.Errorf("load: %s needs a client certificate", cfg.Transport)
		}
		if len(cfg.SANs) == 0 {
			return nil, fmt.Errorf("load: %s needs the server's expected identity (--san)", cfg.Transport)
		}
		d.tls = mtls.ClientConfig(cfg.Cert, cfg.SANs)
		if cfg.Transport == HBONE {
			if cfg.Authority == "" {
				return nil, errors.New("load: hbone needs a CONNECT authority")
			}
			streams := cfg.StreamsPerConn
			if streams <= 0 {
				streams = hbone.DefaultClientMaxStreams
			}
			d.pool = hbone.NewPool(hbone.PoolConfig{MaxStreamsPerConn: streams})
		}
	default:
		return nil, fmt.Errorf("load: unknown transport %q", cfg.Transport)
	}
	return d, nil
}

// String describes the dialer for reports.
func (d *Dialer) String() string {
	if d.cfg.Transport == HBONE {
		return fmt.Sprintf("hbone %s via %s", d.cfg.Authority, d.cfg.Target)
	}
	return fmt.Sprintf("%s %s", d.cfg.Transport, d.cfg.Target)
}

// Transport returns the dialer's transport.
func (d *Dialer) Transport() Transport { return d.cfg.Transport }

// Dial opens one connection (for HBONE: one stream).
func (d *Dialer) Dial(ctx context.Context) (Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	switch d.cfg.Transport {
	case TLS:
		return d.dialTLS(ctx)
	case HBONE:
		s, err := d.pool.Connect(ctx, "load", d.dialRecord, &hbone.Request{Authority: d.cfg.Authority})
		if err != nil {
			return nil, fmt.Errorf("load: connect %s via %s: %w", d.cfg.Authority, d.cfg.Target, err)
		}
		return s, nil
	default:
		c, err := d.cfg.NetDialer.DialContext(ctx, "tcp", d.cfg.Target)
		if err != nil {
			return nil, err
		}
		return c.(*net.TCPConn), nil
	}
}

func (d *Dialer) dialTLS(ctx context.Context) (*tls.Conn, error) {
	raw, err := d.cfg.NetDialer.DialContext(ctx, "tcp", d.cfg.Target)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, d.tls)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("load: tls handshake with %s: %w", d.cfg.Target, err)
	}
	return tc, nil
}

// dialRecord is dialTLS for HBONE, over mtls/record as the daemon's own
// HBONE client: each batch of HTTP/2 frames leaves in one syscall.
func (d *Dialer) dialRecord(ctx context.Context) (net.Conn, error) {
	raw, err := d.cfg.NetDialer.DialContext(ctx, "tcp", d.cfg.Target)
	if err != nil {
		return nil, err
	}
	tc := record.Client(raw, d.tls)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("load: tls handshake with %s: %w", d.cfg.Target, err)
	}
	return tc, nil
}

// Close releases pooled connections.
func (d *Dialer) Close() error {
	if d.pool != nil {
		return d.pool.Close()
	}
	return nil
}

// CertConfig says where a client or peer gets its certificate: issued for
// Identity by the CA in CACert/CAKey (the mesh's shared built-in CA), or
// read from CertFile/KeyFile with CACert as the roots.
type CertConfig struct {
	CACert, CAKey     string
	CertFile, KeyFile string
	// Identity is the SPIFFE identity to issue (or to expect in CertFile).
	Identity string
}

// Enabled reports whether any certificate source was given.
func (c CertConfig) Enabled() bool {
	return c.CACert != "" || c.CAKey != "" || c.CertFile != "" || c.KeyFile != ""
}

// LoadCert returns the certificate cfg describes.
func LoadCert(ctx context.Context, cfg CertConfig) (*mtls.WorkloadCert, error) {
	if cfg.CACert == "" {
		return nil, errors.New("load: a CA certificate (--ca-cert) is required for tls and hbone")
	}
	caPEM, err := os.ReadFile(cfg.CACert)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	var id identity.Identity
	if cfg.Identity != "" {
		if id, err = identity.Parse(cfg.Identity); err != nil {
			return nil, fmt.Errorf("load: --identity: %w", err)
		}
	}
	switch {
	case cfg.CertFile != "" || cfg.KeyFile != "":
		if cfg.CertFile == "" || cfg.KeyFile == "" {
			return nil, errors.New("load: --cert and --key go together")
		}
		return loadCertFiles(cfg.CertFile, cfg.KeyFile, caPEM, id)
	case cfg.CAKey != "":
		if id.IsZero() {
			return nil, errors.New("load: --identity is required to issue a certificate from the CA")
		}
		keyPEM, err := os.ReadFile(cfg.CAKey)
		if err != nil {
			return nil, fmt.Errorf("load: %w", err)
		}
		ca, err := caclient.LoadBuiltinCA(caPEM, keyPEM)
		if err != nil {
			return nil, err
		}
		return caclient.New(caclient.Config{Signer: ca}).Fetch(ctx, id)
	default:
		return nil, errors.New("load: give --ca-key (to issue a certificate) or --cert and --key")
	}
}

func loadCertFiles(certFile, keyFile string, rootsPEM []byte, id identity.Identity) (*mtls.WorkloadCert, error) {
	chain, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	if id.IsZero() {
		// Expect whatever the leaf says.
		block, _ := pem.Decode(chain)
		if block == nil {
			return nil, fmt.Errorf("load: %s holds no PEM certificate", certFile)
		}
		leaf, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("load: %s: %w", certFile, err)
		}
		for _, u := range leaf.URIs {
			if id, err = identity.Parse(u.String()); err == nil {
				break
			}
		}
		if id.IsZero() {
			return nil, fmt.Errorf("load: %s: %w", certFile, mtls.ErrNoIdentity)
		}
	}
	return mtls.ParseChain([]string{string(chain), string(rootsPEM)}, key, id)
}

func parseKey(keyPEM []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("load: key file holds no PEM block")
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
		return nil, errors.New("load: key is not a signing key")
	}
	if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	return nil, fmt.Errorf("load: unsupported private key (%s)", strings.ToLower(block.Type))
}

// dialAll opens n connections with d, so that a run's workers all start
// together; on a failure it closes those it opened.
func dialAll(ctx context.Context, d *Dialer, n int) ([]Conn, error) {
	conns := make([]Conn, 0, n)
	for range n {
		c, err := d.Dial(ctx)
		if err != nil {
			closeAll(conns)
			return nil, fmt.Errorf("load: dial: %w", err)
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// closeAll closes every connection of conns.
func closeAll(conns []Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// concurrency checks a mode's number of workers or streams: default 1, at
// most MaxConcurrency.
func concurrency(n int) (int, error) {
	if n <= 0 {
		return 1, nil
	}
	if n > MaxConcurrency {
		return 0, fmt.Errorf("load: concurrency %d above %d", n, MaxConcurrency)
	}
	return n, nil
}
