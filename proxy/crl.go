package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// ErrPeerRevoked is why an HBONE connection was closed when a CRL reload
// revoked its peer's certificate (ztunnel: "connection closed: peer
// certificate revoked by CRL").
var ErrPeerRevoked = errors.New("proxy: peer certificate revoked by CRL update")

// watchCRL re-checks the open inbound HBONE connections after every CRL
// reload, for as long as the proxy runs (Drain ends it).
func (p *Proxy) watchCRL() {
	if p.cfg.CRL == nil {
		return
	}
	p.stopCRL = p.cfg.CRL.Subscribe(func(*mtls.CRLSet) { p.closeRevokedInbound() })
}

// closeRevokedInbound closes, abruptly as ztunnel does (revocation is a
// security event, not a drain), every inbound HBONE connection whose client
// certificate chain the CRL in force revokes, and counts each in
// istio_crl_policy_rejections_total{reporter="destination"}.
func (p *Proxy) closeRevokedInbound() int {
	return p.hbsrv.CloseConns(revokedPeer(p.cfg.CRL, func(peer string, c *x509.Certificate) {
		p.log.Info("terminating inbound connection: peer certificate revoked by CRL update",
			"peer", peer, "serial", c.SerialNumber.String(), "workload", p.cfg.Workload.String())
		p.cfg.Metrics.CRLRejected(metrics.ReporterDestination)
	}), ErrPeerRevoked)
}

// admitInbound refuses an inbound HBONE connection whose client the CRL in
// force revokes (hbone.Config.Admit), as ztunnel re-checks a connection when
// it registers it for revocation: its handshake may have been verified
// against the CRLs a reload replaced while the reload's sweep ran.
func (p *Proxy) admitInbound(nc net.Conn) error {
	return admitUnrevoked(p.cfg.CRL, nc, func(peer string, c *x509.Certificate) {
		p.log.Info("rejecting inbound connection: peer certificate revoked by CRL update",
			"peer", peer, "serial", c.SerialNumber.String(), "workload", p.cfg.Workload.String())
		p.cfg.Metrics.CRLRejected(metrics.ReporterDestination)
	})
}

// AdmitOutbound returns the hbone.Config.Admit of the pool behind
// CloseRevokedOutbound: a new pooled connection whose server crl() revokes
// is closed before it carries a stream (its handshake may have been checked
// against the CRLs a reload replaced during the reload's sweep). crl returns
// nil while no CRL is configured.
func AdmitOutbound(crl func() *mtls.CRL, log *slog.Logger, m *metrics.Metrics) func(net.Conn) error {
	return func(nc net.Conn) error {
		return admitUnrevoked(crl(), nc, func(peer string, c *x509.Certificate) {
			log.Info("rejecting outbound connection: upstream certificate revoked by CRL update",
				"peer", peer, "serial", c.SerialNumber.String())
			m.CRLRejected(metrics.ReporterSource)
		})
	}
}

// admitUnrevoked is ErrPeerRevoked, after found, when crl revokes nc's peer;
// nil otherwise, and always without a CRL.
func admitUnrevoked(crl *mtls.CRL, nc net.Conn, found func(peer string, c *x509.Certificate)) error {
	if crl != nil && revokedPeer(crl, found)(nc) {
		return ErrPeerRevoked
	}
	return nil
}

// CloseRevokedOutbound closes every connection of pool whose server
// certificate chain crl revokes now, logging ztunnel's line for each and
// counting it in istio_crl_policy_rejections_total{reporter="source"}. The
// daemon calls it after each CRL reload, once per pool (proxies of a node
// share one), and it returns how many it closed.
func CloseRevokedOutbound(pool *hbone.Pool, crl *mtls.CRL, log *slog.Logger, m *metrics.Metrics) int {
	if crl == nil {
		return 0
	}
	return pool.CloseConns(revokedPeer(crl, func(peer string, c *x509.Certificate) {
		log.Info("terminating outbound connection: upstream certificate revoked by CRL update",
			"peer", peer, "serial", c.SerialNumber.String())
		m.CRLRejected(metrics.ReporterSource)
	}), ErrPeerRevoked)
}

// revokedPeer returns the match function that picks the TLS connections
// (crypto/tls or mtls/record) whose peer crl revokes, calling found for each.
func revokedPeer(crl *mtls.CRL, found func(peer string, c *x509.Certificate)) func(net.Conn) bool {
	return func(nc net.Conn) bool {
		tc, ok := nc.(interface{ ConnectionState() tls.ConnectionState })
		if !ok {
			return false
		}
		cs := tc.ConnectionState()
		c, revoked := crl.RevokedConn(cs)
		if !revoked {
			return false
		}
		peer := "<unknown>"
		if id, err := mtls.PeerIdentity(cs); err == nil {
			peer = id.String()
		}
		found(peer, c)
		return true
	}
}
