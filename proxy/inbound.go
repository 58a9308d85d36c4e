package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/metrics"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/state"
)

// errPeerLimit refuses a connection on 15008 over a per-peer limit.
var errPeerLimit = errors.New("proxy: per-peer limit on 15008 reached")

// peerCount is what one source IP holds on 15008.
type peerCount struct {
	conns      int // handshaking or established
	handshakes int // handshaking
	refused    int // refused over a limit, for log throttling
}

// admitPeer counts a new 15008 connection from ip, or refuses it over a
// per-peer limit. refused is the peer's refusal count when err is set.
func (p *Proxy) admitPeer(ip netip.Addr) (refused int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pc := p.peers[ip]
	if pc == nil {
		pc = &peerCount{}
		p.peers[ip] = pc
	}
	switch {
	case p.cfg.MaxHBONEConnsPerPeer > 0 && pc.conns >= p.cfg.MaxHBONEConnsPerPeer:
		err = fmt.Errorf("%w: %d connections from %v", errPeerLimit, pc.conns, ip)
		p.cfg.Metrics.HBONEPeerRefused("connections")
	case p.cfg.MaxHBONEHandshakesPerPeer > 0 && pc.handshakes >= p.cfg.MaxHBONEHandshakesPerPeer:
		err = fmt.Errorf("%w: %d TLS handshakes in progress from %v", errPeerLimit, pc.handshakes, ip)
		p.cfg.Metrics.HBONEPeerRefused("handshakes")
	}
	if err != nil {
		pc.refused++
		return pc.refused, err
	}
	pc.conns++
	pc.handshakes++
	return 0, nil
}

// handshakeDone and peerDone undo admitPeer's counts.
func (p *Proxy) handshakeDone(ip netip.Addr) {
	p.mu.Lock()
	p.peers[ip].handshakes--
	p.mu.Unlock()
}

func (p *Proxy) peerDone(ip netip.Addr) {
	p.mu.Lock()
	pc := p.peers[ip]
	if pc.conns--; pc.conns == 0 {
		delete(p.peers, ip)
	}
	p.mu.Unlock()
}

// handleHBONE terminates mTLS on 15008 and starts serving HTTP/2 CONNECT
// streams on the connection. Once it has started (an event loop owns it,
// or hbone's goroutines), the worker is free: it reports true, and the
// connection's end (hboneEnded) gives back what it holds.
func (p *Proxy) handleHBONE(c *net.TCPConn) bool {
	src := addrPortOf(c.RemoteAddr())
	ip := src.Addr()
	if refused, err := p.admitPeer(ip); err != nil {
		// A flood must not flood the log too: the 1st, 2nd, 4th, 8th...
		// refusal of a peer is logged.
		if refused&(refused-1) == 0 {
			cn := newConn(p, dirInbound, src)
			cn.dst = addrPortOf(c.LocalAddr()) // as ztunnel logs an early deny: the address it arrived on
			cn.fail(fmt.Errorf("%w (refused %d so far)", err, refused))
		}
		_ = c.SetLinger(0)
		c.Close()
		return false
	}
	tlsConn := serverTLS(c, p.cfg.TLS.ServerConfig(p.serverCert, mtls.WithCRL(p.cfg.CRL)))
	p.cfg.Metrics.SocketOpened(metrics.ReporterDestination)
	hctx, cancel := context.WithTimeout(p.ctx, p.cfg.HandshakeTimeout)
	err := tlsConn.HandshakeContext(hctx)
	cancel()
	p.handshakeDone(ip)
	if err != nil {
		if errors.Is(err, mtls.ErrRevoked) {
			p.cfg.Metrics.CRLRejected(metrics.ReporterDestination)
		}
		cn := newConn(p, dirInbound, src)
		cn.dst = addrPortOf(c.LocalAddr())
		cn.fail(fmt.Errorf("tls handshake: %w", err))
		c.Close()
		p.hbonePeerGone(ip)
		return false
	}
	// The peer's identity is the TLS connection's: read it once here, not
	// for every CONNECT stream the connection carries.
	// Its streams' records point at it rather than each holding a copy.
	peer := new(peerIdentity)
	peer.id, peer.err = mtls.PeerIdentity(tlsConn.ConnectionState())
	ctx := context.WithValue(p.ctx, peerIdentityKey{}, peer)
	err = p.hbsrv.Start(ctx, tlsConn, func(err error) {
		p.hboneEnded(src, tlsConn, err)
		// What serveOne gives back for a connection its serve did not
		// keep: the accepted socket's budget, the proxy's hold.
		p.cfg.Budget.Release(ip, budgetSocket)
		p.release(c)
	})
	if err != nil {
		p.hboneEnded(src, tlsConn, err)
		return false
	}
	return true
}

// hboneEnded is the end of an HBONE connection on 15008 that completed
// its handshake: logged, closed, and no longer counted for its peer.
func (p *Proxy) hboneEnded(src netip.AddrPort, tlsConn net.Conn, err error) {
	if err != nil && !errors.Is(err, net.ErrClosed) {
		p.log.Debug("hbone connection ended", "src.addr", src.String(), "error", err)
	}
	tlsConn.Close()
	p.hbonePeerGone(src.Addr())
}

// hbonePeerGone undoes what a connection on 15008 counted once admitted:
// its peer's connection (admitPeer) and the open socket.
func (p *Proxy) hbonePeerGone(ip netip.Addr) {
	p.peerDone(ip)
	p.cfg.Metrics.SocketClosed(metrics.ReporterDestination)
}

// peerIdentityKey keys the peerIdentity of an HBONE connection in the
// context its CONNECT handlers get (a *peerIdentity).
type peerIdentityKey struct{}

// peerIdentity is the SPIFFE identity the peer's verified certificate
// carries, or why it has none.
type peerIdentity struct {
	id  identity.Identity
	err error
}

// serverCert returns the certificate of the workload this proxy serves.
func (p *Proxy) serverCert() (*mtls.WorkloadCert, error) {
	w, _, err := p.router.localWorkload(p.ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	return p.cfg.Certs.Get(ctx, p.router.identityOf(w))
}

// inboundError carries the HTTP status an inbound failure answers with.
type inboundError struct {
	status int
	err    error
}

func (e *inboundError) Error() string { return e.err.Error() }
func (e *inboundError) Unwrap() error { return e.err }

func inboundErr(status int, format string, args ...any) error {
	return &inboundError{status: status, err: fmt.Errorf(format, args...)}
}

// errPolicyRejection is the error of a connection a policy refused, in
// ztunnel's words (its AuthorizationPolicyRejection), which operators match:
// "connection closed due to policy rejection: " and the decision's reason.
func errPolicyRejection(reason string) error {
	return fmt.Errorf("connection closed due to policy rejection: %s", reason)
}

// errIPMismatch is the error of a CONNECT whose authority names another IP
// than the one the tunnel arrived on, in ztunnel's words (its IPMismatch):
// "ip mismatch: <connection's destination> != <authority's IP>".
func errIPMismatch(conn, authority netip.Addr) error {
	return fmt.Errorf("ip mismatch: %s != %s", conn, authority)
}

// serveHBONE handles one CONNECT stream: validate, authorize, dial the app,
// answer 200 and relay.
func (p *Proxy) serveHBONE(ctx context.Context, req *hbone.ServerRequest) {
	cn := newConn(p, dirInbound, addrPortOf(req.Conn.RemoteAddr()))
	// The app socket the stream will dial, taken before any work. Refused,
	// the stream is answered 503, what ztunnel answers when that dial
	// fails for want of descriptors (EMFILE), rather than REFUSED_STREAM,
	// which invites the client to retry at once on another connection to
	// the same peer.
	if !p.admitBudget(listenerHBONEStream, cn.src.Addr(), budgetUpstream) {
		if _, err := req.Respond(http.StatusServiceUnavailable, nil); err != nil {
			p.log.Debug("respond failed", "error", err)
		}
		return
	}
	relayed := false
	defer func() {
		if !relayed { // else the relay's end gives it back (relayEnded)
			p.cfg.Budget.Release(cn.src.Addr(), budgetUpstream)
		}
	}()
	cn.mtls = true
	cn.inboundMeta(req) // headers.go
	app, authorized, err := p.inboundAuthorize(ctx, req, cn)
	if err != nil {
		ie, ok := errors.AsType[*inboundError](err)
		if !ok {
			ie = &inboundError{status: http.StatusServiceUnavailable, err: err}
			err = ie
		}
		// As ztunnel: a request refused before its context was complete
		// (bad authority, ip mismatch, unknown service) is only logged; one
		// refused by policy or by the app is counted too, its flags from
		// the status (responseFlags).
		if cn.metric != nil {
			cn.end(err)
		} else {
			cn.fail(err)
		}
		if _, rerr := req.Respond(ie.status, nil); rerr != nil {
			p.log.Debug("respond failed", "error", rerr)
		}
		return
	}
	s, err := req.Respond(http.StatusOK, p.responseHeader(cn.dstWorkload))
	if err != nil {
		app.Close()
		cn.end(withFlags(metrics.FlagConnect, err))
		return
	}
	cn.trackPolicy(authorized)
	cn.listStream()
	relayed = true
	// The handler returns at once; the engine owns the relay.
	cn.relay(streamEndpoint{s}, engine.TCPEndpoint{TCPConn: app})
}

// inboundAuthorize validates and authorizes a CONNECT and dials the app;
// the snapshot returned allowed cn.PolicyConn(), for the connection
// manager's later re-checks.
func (p *Proxy) inboundAuthorize(ctx context.Context, req *hbone.ServerRequest, cn *conn) (*net.TCPConn, *state.Snapshot, error) {
	host, target, err := splitAuthority(req.Authority) // authority.go
	if err != nil {
		if _, ok := errors.AsType[*inboundError](err); ok {
			return nil, nil, err
		}
		return nil, nil, inboundErr(http.StatusBadRequest, "%w", err)
	}
	// An application tunnel's PROXY header names the authority's address
	// unmapped, as before ztunnel's spelling rules came in (validation
	// below sees it as written).
	authority := netip.AddrPortFrom(target.Addr().Unmap(), target.Port())
	cn.dst = target
	peer, ok := ctx.Value(peerIdentityKey{}).(*peerIdentity)
	if !ok {
		return nil, nil, inboundErr(http.StatusBadRequest, "connection is not mutual TLS")
	}
	if peer.err != nil {
		return nil, nil, inboundErr(http.StatusUnauthorized, "peer identity: %w", peer.err)
	}
	cn.srcIdentity = &peer.id

	w, snap, err := p.router.localWorkload(ctx)
	if err != nil {
		return nil, nil, inboundErr(http.StatusServiceUnavailable, "%w", err)
	}
	cn.dstWorkload = w
	cn.srcWorkload = p.router.inboundSource(ctx, snap, req, cn.src)

	local := addrPortOf(req.Conn.LocalAddr())
	if host != "" {
		// A service hostname (double HBONE): service port -> target port.
		if target, err = hostAuthorityTarget(snap, w, host, target.Port(), local.Addr()); err != nil {
			return nil, nil, err
		}
		cn.dst = target
	}
	if snap, err = p.router.validateDestination(ctx, snap, w, target, local); err != nil {
		return nil, nil, err
	}
	// The app is always this pod; the authority gives the port (and may
	// name another IP in the exceptions validateDestination allows).
	target = netip.AddrPortFrom(local.Addr(), target.Port())
	cn.dst = target
	// The tunnel's own address must be the workload's (dialguard.go): a
	// stream on 15008 reached through loopback or an address the record
	// does not list is not this workload's traffic.
	if err := p.checkInboundTarget(target, w); err != nil {
		return nil, nil, inboundErr(http.StatusBadRequest, "%w", err)
	}
	cn.service = guessInboundService(inboundCandidates(snap, w, host), cn.ext.forHost, w, appPort(w, target.Port()))
	cn.open()
	// What re-checks evaluate too (connmgr reads it from cn).
	dec := snap.Authorize(cn.PolicyConn())
	p.logDryRun(snap, cn.PolicyConn()) // dryrun.go
	if !dec.Allowed {
		return nil, nil, &inboundError{status: http.StatusUnauthorized, err: errPolicyRejection(dec.Reason)}
	}
	if t := proxyTunnel(w); t != nil { // apptunnel.go
		tunnelDst, err := tunnelTarget(snap, w, host, authority, p.cfg.Network)
		if err != nil {
			return nil, nil, inboundErr(http.StatusServiceUnavailable, "%w", err)
		}
		app, err := p.dialAppTunnel(ctx, cn, target, tunnelDst, t.Port)
		if err != nil {
			return nil, nil, inboundErr(http.StatusServiceUnavailable, "connect to %s: %w", target, err)
		}
		return app, snap, nil
	}
	app, err := p.dialApp(ctx, cn.src.Addr(), target)
	if err != nil {
		return nil, nil, inboundErr(http.StatusServiceUnavailable, "connect to %s: %w", target, err)
	}
	return app, snap, nil
}

// spoofsSource reports whether dialApp tries src as the source of its
// connect to dst. A connect that does not (nothing to try first) can be left
// to the engine's event loop (engine.StartDial), and fails with the same
// error dialApp's would.
func (p *Proxy) spoofsSource(src netip.Addr, dst netip.AddrPort) bool {
	return p.origSrc && src.IsValid() && src.Is4() == dst.Addr().Is4()
}

// dialApp connects to the local app at dst, presenting the original
// client's IP src as the source when original-source spoofing is possible.
// An inbound HBONE connection to a workload with a PROXY application tunnel
// is dialled by dialAppTunnel instead (inboundAuthorize).
func (p *Proxy) dialApp(ctx context.Context, src netip.Addr, dst netip.AddrPort) (*net.TCPConn, error) {
	if p.spoofsSource(src, dst) {
		d := p.dialer
		d.Options.Transparent = true
		c, err := d.Dial(ctx, src, dst)
		if err == nil {
			return c, nil
		}
		if p.cfg.OrigSrc != nil {
			return nil, fmt.Errorf("original source %s: %w", src, err)
		}
		// Best effort: fall back to our own address (no NET_ADMIN, or no
		// routing for spoofed replies).
		p.log.Debug("original source unavailable, dialing without it", "error", err)
	}
	return p.dialer.Dial(ctx, netip.Addr{}, dst)
}
