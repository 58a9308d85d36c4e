package inpod

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// run is the owner loop: connect, serve the stream, reconnect with backoff.
func (m *Manager) run() {
	defer close(m.done)
	backoff := m.cfg.MinBackoff
	for {
		conn, err := m.connect(&backoff)
		if err != nil {
			return // drained while connecting
		}
		progressed, err := m.serve(conn)
		conn.Close()
		m.notReady()
		if pe := (*ProtocolError)(nil); errors.As(err, &pe) {
			m.log.Error("protocol mismatch error while processing stream, shutting down", "error", err)
			m.err = err
			return
		}
		if m.ctx.Err() != nil {
			return
		}
		if err == nil {
			m.log.Info("ZDS stream ended by the CNI agent, reconnecting")
		} else {
			m.log.Warn("ZDS stream ended, reconnecting", "error", err)
		}
		if progressed {
			backoff = m.cfg.MinBackoff
			continue
		}
		// Nothing was exchanged: the agent may be restarting or may not
		// speak our protocol. Do not spin on it.
		if !m.sleep(backoff) {
			return
		}
		backoff = min(backoff*2, m.cfg.MaxBackoff)
	}
}

// connect dials the agent's socket until it answers or the manager drains.
func (m *Manager) connect(backoff *time.Duration) (*net.UnixConn, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(m.ctx, "unixpacket", m.cfg.UDS)
		if err == nil {
			m.log.Info("connected to the CNI agent", "uds", m.cfg.UDS)
			return c.(*net.UnixConn), nil
		}
		if m.ctx.Err() != nil {
			return nil, m.ctx.Err()
		}
		*backoff = min(*backoff*2, m.cfg.MaxBackoff)
		m.log.Warn("failed to connect to the Istio CNI node agent, is the node agent healthy?",
			"uds", m.cfg.UDS, "error", err, "retry_in", backoff.String())
		if !m.sleep(*backoff) {
			return nil, m.ctx.Err()
		}
	}
}

func (m *Manager) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-m.ctx.Done():
		return false
	}
}

// serve runs one stream: hello, then one response per request, retrying
// pending pods when their timer fires. progressed reports whether any
// request was processed. A nil error is a clean end of stream (or drain).
func (m *Manager) serve(conn *net.UnixConn) (progressed bool, err error) {
	m.resetSnapshot()
	stop := context.AfterFunc(m.ctx, func() { conn.Close() })
	defer stop()
	if err := m.send(conn, helloPacket()); err != nil {
		return false, &announceError{err}
	}
	buf, oob := make([]byte, maxPacket), make([]byte, oobSpace)
	for {
		// The pending retry rides on the read deadline: the loop stays the
		// only owner, and a deadline that fires consumes no packet.
		if err := conn.SetReadDeadline(m.retryAt); err != nil {
			return progressed, err
		}
		req, err := readRequest(conn, buf, oob)
		if err != nil {
			switch {
			case m.ctx.Err() != nil:
				return progressed, nil
			case errors.Is(err, os.ErrDeadlineExceeded):
				m.retryPending()
				continue
			case errors.Is(err, io.EOF):
				return progressed, nil
			}
			m.log.Error("failed to read message", "error", err)
			if serr := m.send(conn, ackPacket("failure to read message: "+err.Error())); serr != nil {
				return progressed, errors.Join(err, serr)
			}
			// Undecodable: reconnect, as ztunnel does. Proxies keep serving
			// and the agent's replay re-syncs us.
			return progressed, err
		}
		progressed = true
		herr := m.handle(req)
		var pe *proxyError
		switch {
		case herr == nil:
			m.checkReady()
			err = m.send(conn, ackPacket(""))
		case errors.As(herr, &pe):
			m.log.Error("failed to start proxy", "uid", pe.uid, "error", pe.err)
			m.scheduleRetry()
			m.checkReady()
			err = m.send(conn, ackPacket(herr.Error()))
		default:
			m.log.Error("failed to process message", "request", req.kind.String(), "uid", req.uid, "error", herr)
			_ = m.send(conn, ackPacket("failure to process message: "+herr.Error()))
			return progressed, herr
		}
		if err != nil {
			return progressed, err
		}
	}
}

func (m *Manager) send(conn *net.UnixConn, b []byte) error {
	if err := conn.SetWriteDeadline(time.Now().Add(m.cfg.WriteTimeout)); err != nil {
		return err
	}
	_, err := conn.Write(b)
	return err
}

// handle applies one request to the pod tables.
func (m *Manager) handle(req request) error {
	switch req.kind {
	case kindAdd:
		info := WorkloadInfo{}
		if req.info != nil {
			info = *req.info
		}
		m.log.Info("pod received, starting proxy", "uid", req.uid, "name", info.Name, "namespace", info.Namespace)
		if req.info == nil {
			req.netns.Close()
			return &ProtocolError{Reason: "workload_info is required but not present"}
		}
		if !m.snapshot {
			m.seen[req.uid] = struct{}{}
		}
		req.netns.home = m.home.fd
		return m.addWorkload(req.uid, info, req.netns)
	case kindKeep:
		m.log.Info("pod keep received, will not delete it when the snapshot is sent", "uid", req.uid)
		if m.snapshot {
			return &ProtocolError{Reason: "pod keep received after snapshot"}
		}
		m.seen[req.uid] = struct{}{}
		return nil
	case kindDel:
		m.log.Info("pod delete request, shutting down proxy", "uid", req.uid)
		if !m.snapshot {
			// The snapshot's reconcile stops a running proxy; a pending one
			// it cannot see, so drop that here.
			delete(m.seen, req.uid)
			m.dropPending(req.uid)
			m.updateCounts()
			return nil
		}
		m.dropPending(req.uid)
		m.stopWorkload(req.uid)
		m.updateCounts()
		return nil
	case kindSnapshot:
		m.log.Info("received snapshot sent")
		if m.snapshot {
			return &ProtocolError{Reason: "pod snapshot received already"}
		}
		m.reconcile()
		m.snapshot = true
		return nil
	}
	return fmt.Errorf("inpod: unhandled request %v", req.kind)
}
