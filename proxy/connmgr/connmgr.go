package connmgr

import (
	"context"
	"math"
	"sync"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel/state"
)

// ClosedReason starts the reason passed to a tracked connection's close
// function when a policy change denies it; the decision's reason follows,
// after ": ".
const ClosedReason = "connection closed due to policy change"

// Config configures a Manager.
type Config struct {
	// Store is the snapshot store Run watches: every published snapshot
	// whose PolicyGeneration differs from the last one Run saw re-checks the
	// tracked connections. Track also uses it to catch a policy change that
	// raced with the connection's authorization. Nil: no automatic
	// re-checks; only explicit Recheck calls close connections.
	Store *state.Store
	// Logf logs each connection closed by a re-check and each policy
	// change. Nil discards.
	Logf func(format string, args ...any)
}

// numShards spreads tracked connections over this many independently
// locked lists, so that Track and Untrack from many goroutines rarely
// contend.
const numShards = 64

// noGeneration marks a connection authorized against an unknown snapshot;
// no snapshot has it, so the connection is always re-evaluated.
const noGeneration = math.MaxUint64

// Manager tracks authorized inbound connections. Its methods are safe for
// concurrent use. A nil *Manager tracks nothing: Track returns nil, whose
// Untrack does nothing.
type Manager struct {
	store *state.Store
	logf  func(format string, args ...any)

	shards [numShards]shard

	// observed, when set (by tests, before Run), is called by Run after it
	// has handled a published snapshot, with whether it re-checked.
	observed func(snap *state.Snapshot, rechecked bool)
}

// shard is one set of tracked connections. A slice rather than a linked
// list: a re-check walks it without chasing pointers from entry to entry.
type shard struct {
	// mu guards the following field and the idx of the shard's entries.
	mu      sync.Mutex
	entries []*Tracked
	_       [32]byte // keep shards on separate cache lines
}

// Conn is a connection as the Manager tracks it. A caller that keeps a
// record per connection anyway implements it on that record and tracks it
// with TrackConn, so tracking copies nothing (an idle connection holds a
// 48-byte Tracked, not a copy of its attributes and a closure).
type Conn interface {
	// PolicyConn returns the attributes the connection was authorized
	// with; they must not change while it is tracked.
	PolicyConn() state.Conn
	// PolicyClose is called at most once, with a reason starting with
	// ClosedReason, when a later policy change denies the connection; it
	// should reset the connection and return quickly. It is called with
	// no lock held, so it may call Untrack.
	PolicyClose(reason string)
}

// Tracked is one tracked connection. It is created by Track or TrackConn
// and removed by Untrack or by a re-check that closes it.
type Tracked struct {
	c  Conn
	sh *shard
	// gen is the policy generation of a snapshot that allowed conn: the
	// one it was authorized with, then the last re-check's.
	gen atomic.Uint64

	// idx is t's index in sh.entries, or -1 once untracked. Guarded by
	// sh.mu.
	idx int
}

// New returns a Manager. Call Run to re-check connections when the
// policies in cfg.Store change.
func New(cfg Config) *Manager {
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Manager{store: cfg.Store, logf: logf}
}

// Run re-checks the tracked connections against each snapshot published to
// the Store whose PolicyGeneration differs from the previous one, until ctx
// is done. It is the Manager's only goroutine, owned by the caller; call it
// once. Snapshots published in quick succession may be checked only once,
// against the latest. Without a Store, Run just waits for ctx.
func (m *Manager) Run(ctx context.Context) {
	if m.store == nil {
		<-ctx.Done()
		return
	}
	last := uint64(noGeneration)
	for {
		ch := m.store.Changed()
		snap := m.store.Load()
		gen := snap.PolicyGeneration()
		recheck := gen != last
		if recheck {
			n, closed := m.recheck(snap)
			if last != noGeneration {
				m.logf("policies changed (generation %d): re-checked %d connections, closed %d", gen, n, closed)
			}
			last = gen
		}
		if m.observed != nil {
			m.observed(snap, recheck)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// Track registers c, which snap has just allowed, until Untrack. closeFn is
// called at most once, with a reason starting with ClosedReason, when a
// later policy change denies c; it should reset the connection and return
// quickly. It is called with no lock held, so it may call Untrack, and it
// may be called before Track returns: when a policy change was published
// between snap and this call, c is checked against it at once.
//
// snap may be nil when the caller does not know which snapshot allowed c;
// c is then re-evaluated against the Store's current snapshot at once.
// Track allocates only the returned entry (with c and closeFn in it).
func (m *Manager) Track(snap *state.Snapshot, c state.Conn, closeFn func(reason string)) *Tracked {
	if m == nil {
		return nil
	}
	f := &funcConn{conn: c, closeFn: closeFn}
	f.t.c = f
	m.track(&f.t, snap)
	return &f.t
}

// TrackConn is Track for a Conn: c.PolicyConn() is what snap has just
// allowed, and c.PolicyClose is the close function. It allocates only the
// returned entry.
func (m *Manager) TrackConn(snap *state.Snapshot, c Conn) *Tracked {
	if m == nil {
		return nil
	}
	t := &Tracked{c: c}
	m.track(t, snap)
	return t
}

// funcConn is the Conn of Track, allocated with its entry.
type funcConn struct {
	t       Tracked
	conn    state.Conn
	closeFn func(reason string)
}

func (f *funcConn) PolicyConn() state.Conn    { return f.conn }
func (f *funcConn) PolicyClose(reason string) { f.closeFn(reason) }

// track links t (its c set) into a shard and checks it against a policy
// change that raced with its authorization by snap.
func (m *Manager) track(t *Tracked, snap *state.Snapshot) {
	gen := uint64(noGeneration)
	if snap != nil {
		gen = snap.PolicyGeneration()
	}
	t.gen.Store(gen)
	c := t.c.PolicyConn()
	sh := &m.shards[shardOf(&c)]
	t.sh = sh
	sh.mu.Lock()
	t.idx = len(sh.entries)
	sh.entries = append(sh.entries, t)
	sh.mu.Unlock()

	// A policy change published after snap was loaded and already
	// re-checked by Run would miss t, which was not linked yet. Any change
	// published after this Load will find it linked.
	if m.store != nil {
		if cur := m.store.Load(); cur.PolicyGeneration() != gen {
			m.check(t, cur)
		}
	}
}

// shardOf picks a shard from the source address and port: cheap, and
// spread by the peer's ephemeral ports.
func shardOf(c *state.Conn) int {
	a := c.Src.Addr().As16()
	h := uint32(c.Src.Port()) | uint32(a[15])<<16 | uint32(a[14])<<24
	h *= 0x9e3779b1
	return int(h >> (32 - 6)) // numShards == 1<<6
}

// Untrack stops tracking t. It is idempotent, and a no-op on nil or after
// a re-check closed t.
func (t *Tracked) Untrack() {
	if t != nil {
		t.unlink()
	}
}

// Conn returns the attributes t was authorized with.
func (t *Tracked) Conn() state.Conn { return t.c.PolicyConn() }

// unlink removes t from its shard and reports whether it was there.
func (t *Tracked) unlink() bool {
	sh := t.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := t.idx
	if i < 0 {
		return false
	}
	last := len(sh.entries) - 1
	sh.entries[i] = sh.entries[last]
	sh.entries[i].idx = i
	sh.entries[last] = nil
	sh.entries = sh.entries[:last]
	t.idx = -1
	// Give memory back after a burst of connections.
	if c := cap(sh.entries); c > 1024 && last < c/4 {
		sh.entries = append(make([]*Tracked, 0, c/2), sh.entries...)
	}
	return true
}

// Recheck re-evaluates every tracked connection against snap (except those
// already allowed by snap's policy generation) and closes the denied ones:
// each is untracked and its close function called, with no lock held. It
// returns how many it closed. Concurrent calls are safe; each connection is
// closed at most once.
func (m *Manager) Recheck(snap *state.Snapshot) int {
	_, closed := m.recheck(snap)
	return closed
}

// recheck is Recheck; it also returns how many connections it evaluated.
func (m *Manager) recheck(snap *state.Snapshot) (evaluated, closed int) {
	gen := snap.PolicyGeneration()
	var batch []*Tracked
	for i := range m.shards {
		sh := &m.shards[i]
		// Collect under the lock, evaluate outside it: evaluation may be
		// slow, Track and Untrack must not wait for it, and close
		// functions run with no lock held.
		batch = batch[:0]
		sh.mu.Lock()
		for _, t := range sh.entries {
			if t.gen.Load() != gen {
				batch = append(batch, t)
			}
		}
		sh.mu.Unlock()
		for _, t := range batch {
			if m.check(t, snap) {
				closed++
			}
		}
		evaluated += len(batch)
	}
	return evaluated, closed
}

// check evaluates t against snap and, if it is denied and still tracked,
// untracks and closes it. It reports whether it closed t.
func (m *Manager) check(t *Tracked, snap *state.Snapshot) bool {
	c := t.c.PolicyConn()
	d := snap.Authorize(c)
	if d.Allowed {
		// Only ever store a generation that allowed t, so that t.gen always
		// names policies t is allowed by.
		t.gen.Store(snap.PolicyGeneration())
		return false
	}
	if !t.unlink() {
		return false // untracked or closed meanwhile
	}
	m.logf("%s: src=%v dst=%v src_identity=%q: %s", ClosedReason, c.Src, c.Dst, c.SrcIdentity.String(), d.Reason)
	t.c.PolicyClose(ClosedReason + ": " + d.Reason)
	return true
}

// Len returns the number of tracked connections.
func (m *Manager) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.entries)
		sh.mu.Unlock()
	}
	return n
}
