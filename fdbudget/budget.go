package fdbudget

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultFloor is the units every peer may hold whatever the others hold,
// while the total has room: a few connections, so that a peer arriving
// while many others crowd the budget still gets in.
const DefaultFloor = 16

// Config configures a Budget.
type Config struct {
	// Total is the number of units (descriptors) the budget hands out; see
	// NoFileLimit and DefaultReserve for the daemon's. Zero or negative
	// makes New return nil, the unlimited budget.
	Total int
	// Floor is what every peer may hold whatever the others hold, while the
	// total has room. Zero means DefaultFloor; negative means none.
	Floor int
}

// Reason is the outcome of an Acquire.
type Reason uint8

// The outcomes of an Acquire. The refusals' names are the reason label of
// the refusal metric.
const (
	// OK: the units were taken.
	OK Reason = iota
	// OverPeer: the peer holds its share; other peers may still take.
	OverPeer
	// OverTotal: the budget is spent.
	OverTotal
)

// String is the reason's name: "ok", "peer" or "total".
func (r Reason) String() string {
	switch r {
	case OK:
		return "ok"
	case OverPeer:
		return "peer"
	case OverTotal:
		return "total"
	}
	return "unknown"
}

// numShards is how many shards the peers are kept in: enough that two
// cores rarely meet on one lock, few enough that Stats stays cheap.
const numShards = 64

// shard is one part of the peer table, alone on its cache line.
type shard struct {
	mu   sync.Mutex // guards the following field
	held map[[16]byte]int
	_    [48]byte
}

// Budget is the daemon's descriptor budget. Its methods are safe for
// concurrent use; on a nil *Budget they allow everything.
type Budget struct {
	total int64
	floor int64

	_    [48]byte
	used atomic.Int64 // units held by all peers; never above total; alone on its cache line
	_    [56]byte

	refused    [3]atomic.Uint64 // by Reason
	unbalanced atomic.Uint64    // Releases of more than the peer held

	gate logGate

	shards [numShards]shard
}

// New returns a budget of cfg.Total units, or nil (unlimited) when
// cfg.Total is not positive.
func New(cfg Config) *Budget {
	if cfg.Total <= 0 {
		return nil
	}
	switch {
	case cfg.Floor == 0:
		cfg.Floor = DefaultFloor
	case cfg.Floor < 0:
		cfg.Floor = 0
	}
	b := &Budget{total: int64(cfg.Total), floor: int64(cfg.Floor)}
	for i := range b.shards {
		b.shards[i].held = make(map[[16]byte]int)
	}
	b.gate.now = time.Now
	return b
}

// key is how a peer is counted: its IP's 16 bytes, so that an IPv4
// address and its IPv4-mapped IPv6 form are one peer and a zone makes no
// other. (The bytes hash faster than a netip.Addr, whose zone is a
// pointer.)
func key(peer netip.Addr) [16]byte {
	return peer.As16()
}

// shardOf picks k's shard (a multiplicative hash of both halves; the map
// inside the shard hashes with its own seed).
func (b *Budget) shardOf(k [16]byte) *shard {
	hi, lo := binary.BigEndian.Uint64(k[:8]), binary.BigEndian.Uint64(k[8:])
	h := (lo ^ hi*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9
	return &b.shards[h>>(64-6)]
}

// Acquire takes n units for peer, or refuses and says why. A peer holding
// h units may take n more when the total has room and h+n is at most the
// floor or at most what stays free after the take.
func (b *Budget) Acquire(peer netip.Addr, n int) Reason {
	if b == nil || n <= 0 {
		return OK
	}
	k := key(peer)
	s := b.shardOf(k)
	want := int64(n)
	s.mu.Lock()
	h := int64(s.held[k])
	for {
		u := b.used.Load()
		free := b.total - u - want // what stays free after the take
		if free < 0 {
			s.mu.Unlock()
			b.refused[OverTotal].Add(1)
			return OverTotal
		}
		if h+want > b.floor && h+want > free {
			s.mu.Unlock()
			b.refused[OverPeer].Add(1)
			return OverPeer
		}
		// The shard's lock orders this peer's takes; other shards' peers
		// move used meanwhile, so the check holds only for the value the
		// swap replaces.
		if b.used.CompareAndSwap(u, u+want) {
			break
		}
	}
	s.held[k] = int(h + want)
	s.mu.Unlock()
	return OK
}

// Release gives back n units peer took. Giving back more than the peer
// holds is a caller's bug: only what it held is given back, and Stats
// counts it as Unbalanced.
func (b *Budget) Release(peer netip.Addr, n int) {
	if b == nil || n <= 0 {
		return
	}
	k := key(peer)
	s := b.shardOf(k)
	s.mu.Lock()
	h := s.held[k]
	if n > h {
		b.unbalanced.Add(1)
		n = h
	}
	if h -= n; h == 0 {
		delete(s.held, k) // a departed peer costs nothing
	} else {
		s.held[k] = h
	}
	s.mu.Unlock()
	b.used.Add(-int64(n))
}

// Held returns the units peer holds.
func (b *Budget) Held(peer netip.Addr) int {
	if b == nil {
		return 0
	}
	k := key(peer)
	s := b.shardOf(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[k]
}

// Used returns the units held by all peers.
func (b *Budget) Used() int {
	if b == nil {
		return 0
	}
	return int(b.used.Load())
}

// Total returns the budget's size in units; 0 for the unlimited budget.
func (b *Budget) Total() int {
	if b == nil {
		return 0
	}
	return int(b.total)
}

// Stats is a budget's state, for dumps and tests.
type Stats struct {
	Total, Floor, Used int
	// Peers is the number of peers holding units.
	Peers int
	// RefusedPeer and RefusedTotal count refusals since the start.
	RefusedPeer, RefusedTotal uint64
	// Unbalanced counts Releases of more than the peer held (a bug of the
	// caller; it should stay zero).
	Unbalanced uint64
}

// Stats returns the budget's figures; Peers is counted shard by shard, so
// it is approximate while peers come and go.
func (b *Budget) Stats() Stats {
	if b == nil {
		return Stats{}
	}
	st := Stats{Total: int(b.total), Floor: int(b.floor), Used: int(b.used.Load()),
		RefusedPeer: b.refused[OverPeer].Load(), RefusedTotal: b.refused[OverTotal].Load(),
		Unbalanced: b.unbalanced.Load()}
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		st.Peers += len(s.held)
		s.mu.Unlock()
	}
	return st
}

// LogRefusal reports whether a refusal just made should be logged, and how
// many refusals went unlogged before it. One log line per refusal would let
// a flooder flood the log too: the first refusal is logged, then at most
// one per interval, which doubles from LogIntervalMin up to LogIntervalMax
// while refusals keep coming and starts over after a quiet interval.
func (b *Budget) LogRefusal() (log bool, unlogged uint64) {
	if b == nil {
		return false, 0
	}
	return b.gate.allow()
}

// The bounds of LogRefusal's interval.
const (
	LogIntervalMin = time.Second
	LogIntervalMax = time.Minute
)

// logGate is LogRefusal's state. A refusal before next costs two atomics;
// the mutex is taken at most once per interval.
type logGate struct {
	now     func() time.Time
	next    atomic.Int64  // unix nanoseconds before which nothing is logged
	skipped atomic.Uint64 // refusals not logged since the last logged one

	mu       sync.Mutex // guards the following field
	interval time.Duration
}

func (g *logGate) allow() (bool, uint64) {
	now := g.now()
	if now.UnixNano() < g.next.Load() {
		g.skipped.Add(1)
		return false, 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	next := time.Unix(0, g.next.Load())
	if now.Before(next) { // another refusal took this turn
		g.skipped.Add(1)
		return false, 0
	}
	// A gap of more than an interval after next saw no refusal (the first
	// one after next is logged): the flood is over, start over.
	if g.interval == 0 || now.Sub(next) > g.interval {
		g.interval = LogIntervalMin
	} else {
		g.interval = min(2*g.interval, LogIntervalMax)
	}
	g.next.Store(now.Add(g.interval).UnixNano())
	return true, g.skipped.Swap(0)
}
