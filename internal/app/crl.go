package app

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"sync"

	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/proxy"
)

// startCRL loads CRL_PATH and polls it for changes until the daemon's
// background context ends; nil (no enforcement) when CRL_PATH is unset.
// A file that is there but does not load fails the start, so a daemon never
// runs without the revocations it was given; a missing file is waited for,
// as ztunnel does (the ConfigMap volume is optional). A later load that fails
// keeps the last good CRLs in force and is logged and counted
// (istio_crl_load_failures_total). After each reload the pool's connections
// to servers now revoked are closed here, and each proxy closes its own
// inbound ones (proxy.Config.CRL).
func (d *Daemon) startCRL(m *metrics.Metrics, builtinRoot []byte) (*mtls.CRL, error) {
	path := d.cfg.CRLPath
	if path == "" {
		return nil, nil
	}
	anchors := &crlAnchors{certs: d.certs, builtin: builtinRoot}
	crl, err := mtls.NewCRL(mtls.CRLConfig{
		Path:    path,
		Anchors: anchors.get,
		OnError: func(err error) {
			m.CRLLoadFailed()
			d.log.Warn("failed to reload crl, keeping the last good one", "path", path, "error", err)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("CRL_PATH: %w", err)
	}
	if s := crl.Set(); s == nil {
		d.log.Warn("crl file not found, will load it once it appears", "path", path)
	} else {
		d.log.Info("crl loaded", "path", path, "crls", s.Len(), "unanchored", s.Unanchored())
	}
	crl.Subscribe(func(s *mtls.CRLSet) {
		n := proxy.CloseRevokedOutbound(d.pool, crl, d.log, m)
		d.log.Info("crl reloaded", "path", path, "crls", s.Len(), "unanchored", s.Unanchored(), "closed_outbound", n)
	})
	d.crl.Store(crl)
	d.bgWG.Go(func() { crl.Run(d.bg) })
	return crl, nil
}

// crlAnchors lists the CA certificates a CRL may be checked against: the
// built-in CA's root and the roots and intermediates of the workload
// certificates held now. Parsed certificates are kept while the PEM they
// came from is unchanged, since a reload asks once per open connection.
type crlAnchors struct {
	certs   *mtls.Store
	builtin []byte // PEM; nil without the built-in CA

	mu     sync.Mutex // guards the following fields
	key    []byte
	parsed []*x509.Certificate
}

func (a *crlAnchors) get() []*x509.Certificate {
	var key bytes.Buffer
	key.Write(a.builtin)
	roots := slices.Clone(a.builtin)
	var inters [][]byte
	for _, c := range a.certs.Certificates() {
		key.Write(c.RootsPEM)
		roots = append(roots, c.RootsPEM...)
		for _, der := range c.Certificate.Certificate[1:] {
			key.Write(der)
			inters = append(inters, der)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.parsed != nil && bytes.Equal(a.key, key.Bytes()) {
		return a.parsed
	}
	var out []*x509.Certificate
	seen := map[string]bool{}
	add := func(der []byte) {
		if seen[string(der)] {
			return
		}
		if c, err := x509.ParseCertificate(der); err == nil && c.IsCA {
			seen[string(der)] = true
			out = append(out, c)
		}
	}
	rest := roots
	for {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			add(b.Bytes)
		}
	}
	for _, der := range inters {
		add(der)
	}
	a.key, a.parsed = key.Bytes(), out
	return out
}

// rootPEM is the built-in CA's root, the one trust anchor known before any
// workload certificate is issued; nil for the Istio CA.
func (s signer) rootPEM() []byte {
	if ca, ok := s.Signer.(*caclient.BuiltinCA); ok {
		return ca.RootPEM()
	}
	return nil
}
