package inpod

import (
	"cmp"
	"os"
	"time"
)

// addWorkload starts uid's proxy, or keeps it pending when that fails.
// It owns ns from here on.
func (m *Manager) addWorkload(uid string, info WorkloadInfo, ns *Netns) error {
	if err := m.startWorkload(uid, info, ns); err != nil {
		m.dropPending(uid)
		m.pending[uid] = &pendingPod{info: info, netns: ns, gen: m.nextGen}
		m.updateCounts()
		return &proxyError{uid: uid, err: err}
	}
	m.dropPending(uid)
	m.updateCounts()
	return nil
}

func (m *Manager) startWorkload(uid string, info WorkloadInfo, ns *Netns) error {
	if cur, ok := m.proxies[uid]; ok {
		if cur.netns.ID() == ns.ID() {
			// The same pod again (a replay): nothing to do.
			if cur.netns != ns {
				ns.Close()
			}
			return nil
		}
		// A new sandbox for the same pod: replace its proxy.
		m.log.Info("pod netns changed, replacing its proxy", "uid", uid, "old", cur.netns.ID().String(), "new", ns.ID().String())
		m.stopWorkload(uid)
	}
	m.nextGen++
	gen := m.nextGen
	m.setState(uid, info, StatePending, nil, gen)
	p, err := m.cfg.NewProxy(Pod{UID: uid, WorkloadInfo: info, Netns: ns})
	if err != nil {
		return err
	}
	if err := m.inPod(uid, ns, p); err != nil {
		return err
	}
	if err := p.Start(m.ctx); err != nil {
		return err
	}
	m.proxies[uid] = &podProxy{info: info, netns: ns, proxy: p, gen: gen}
	m.setState(uid, info, StateUp, p, gen)
	m.cfg.Metrics.ProxyStarted()
	m.log.Info("pod proxy up", "uid", uid, "name", info.Name, "namespace", info.Namespace, "netns", ns.ID().String())
	return nil
}

// inPod does, in one switch of a thread into the pod's namespace, what the
// add of uid does there: tcp_migrate_req (Config.MigrateRequests) and the
// sockets of p when it is a SocketOpener. A switch costs a locked thread
// and two setns calls, and under load the OS may deschedule that thread
// between them: an add paid one per listener before (six with the DNS
// proxy and tcp_migrate_req), and those waits were the tail of add to
// serving at 250 pods (issue 36).
func (m *Manager) inPod(uid string, ns *Netns, p Proxy) error {
	opener, _ := p.(SocketOpener)
	if opener == nil && !m.cfg.MigrateRequests {
		return nil
	}
	var migrateErr error
	err := ns.Run(func() error {
		if m.cfg.MigrateRequests {
			migrateErr = enableMigrateReq()
		}
		if opener != nil {
			return opener.Listen(m.ctx)
		}
		return nil
	})
	if m.cfg.MigrateRequests && (migrateErr != nil || (err != nil && opener == nil)) {
		// Expected with a read-only /proc/sys; the reuseport steering
		// program covers upgrades without it.
		m.log.Info("cannot set net.ipv4.tcp_migrate_req in the pod; upgrades rely on the reuseport steering program", "uid", uid, "error", cmp.Or(migrateErr, err))
	}
	if opener == nil {
		return nil // Start opens the sockets, and reports a failed switch
	}
	if err != nil {
		// Listen closed what it opened; Close releases the rest (all of it
		// when the switch itself failed, before Listen ran).
		p.Close()
	}
	return err
}

// enableMigrateReq runs inside a pod's netns: /proc/sys/net resolves to the
// network namespace of the calling thread.
func enableMigrateReq() error {
	return os.WriteFile("/proc/sys/net/ipv4/tcp_migrate_req", []byte("1"), 0)
}

// stopWorkload closes uid's proxy at once, in the background so the stream
// is answered without waiting; Drain waits for it.
func (m *Manager) stopWorkload(uid string) {
	p, ok := m.proxies[uid]
	if !ok {
		return
	}
	delete(m.proxies, uid)
	// The pod leaves /config_dump now, not once its proxy has closed: an
	// acknowledged Del means the pod is gone (and a test or operator reading
	// the state right after the ack must not see it).
	m.clearState(uid, p.gen)
	m.closing.Go(func() {
		p.proxy.Close()
		m.proxyEnded(uid, p)
	})
}

// proxyEnded releases what a finished proxy held.
func (m *Manager) proxyEnded(uid string, p *podProxy) {
	p.netns.Close()
	m.clearState(uid, p.gen)
	m.cfg.Metrics.ProxyStopped()
	m.log.Info("pod proxy stopped", "uid", uid, "name", p.info.Name, "namespace", p.info.Namespace)
}

func (m *Manager) dropPending(uid string) {
	if pp, ok := m.pending[uid]; ok {
		delete(m.pending, uid)
		pp.netns.Close()
		m.clearState(uid, pp.gen)
	}
}

// reconcile stops every proxy the snapshot did not mention: pods deleted
// while we were not connected.
func (m *Manager) reconcile() {
	for uid := range m.proxies {
		if _, ok := m.seen[uid]; !ok {
			m.log.Info("pod not in the snapshot, shutting down its proxy", "uid", uid)
			m.stopWorkload(uid)
		}
	}
	clear(m.seen)
	m.updateCounts()
}

// resetSnapshot starts a new stream: the agent replays everything.
func (m *Manager) resetSnapshot() {
	clear(m.seen)
	for uid := range m.pending {
		m.dropPending(uid)
	}
	m.snapshot = false
	m.retryAt = time.Time{}
	m.updateCounts()
}

func (m *Manager) scheduleRetry() {
	if m.retryAt.IsZero() {
		m.retryAt = time.Now().Add(m.cfg.RetryInterval)
	}
}

// retryPending tries every pending pod again.
func (m *Manager) retryPending() {
	m.retryAt = time.Time{}
	todo := m.pending
	m.pending = map[string]*pendingPod{}
	for uid, pp := range todo {
		m.log.Info("retrying pod", "uid", uid)
		if err := m.addWorkload(uid, pp.info, pp.netns); err != nil {
			m.log.Info("retrying pod failed", "uid", uid, "error", err)
		}
	}
	if len(m.pending) > 0 {
		m.scheduleRetry()
	}
	m.checkReady()
}

func (m *Manager) checkReady() {
	if m.snapshot && len(m.pending) == 0 {
		if m.blockReady != nil {
			m.log.Debug("workload proxy manager is ready")
			m.blockReady()
			m.blockReady = nil
		}
		return
	}
	m.notReady()
}

func (m *Manager) notReady() {
	if m.blockReady == nil && m.cfg.Ready != nil {
		m.blockReady = m.cfg.Ready(ReadinessTask)
	}
}

func (m *Manager) updateCounts() {
	m.cfg.Metrics.SetActiveProxies(len(m.proxies))
	m.cfg.Metrics.SetPendingProxies(len(m.pending))
}
