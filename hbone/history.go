package hbone

// A server forgets a stream once it is closed on the wire, but RFC 9113
// section 5.1 answers a frame that arrives afterwards by how the stream
// closed: frames the peer sent before it saw our RST_STREAM must be
// ignored, while a peer that ended or reset the stream itself and keeps
// sending is broken (STREAM_CLOSED), and a stream identifier the peer
// skipped was never opened at all (section 5.1.1: PROTOCOL_ERROR). The
// history below keeps the last few closings and skipped ranges, so those
// answers are exact for recent streams; DATA or trailers on an older
// closed stream are treated as frames that crossed our RST_STREAM
// (ignored), which is never wrong towards a correct peer: forgetting only
// makes us more lenient.

// closedHow records how a closed server stream got there.
type closedHow uint8

const (
	closedPeerEnded  closedHow = 1 << iota // the peer sent END_STREAM
	closedPeerReset                        // the peer sent RST_STREAM
	closedLocalReset                       // we sent RST_STREAM
)

// Sizes of the history rings: frames on a closed stream come in the
// round trip after it closed, while the streams closed meanwhile push it
// out; a peer that skips identifiers skips rarely (no client we know of
// does).
const (
	closedRingLen = 32
	skipRingLen   = 8
)

// streamHistory is a server connection's memory of streams that are no
// longer in its map. Guarded by conn.mu; made on first use, as a
// connection whose streams never close needs none.
type streamHistory struct {
	closed     [closedRingLen]closedStream
	closedNext int // slot the next closing takes
	skipped    [skipRingLen]idRange
	skipNext   int
}

type closedStream struct {
	id  uint32 // 0: an empty slot (stream 0 is never a request)
	how closedHow
}

// idRange is the odd stream identifiers lo..hi, both included, that the
// peer skipped when it opened a higher one.
type idRange struct{ lo, hi uint32 }

// noteClosedLocked remembers how server stream id closed; flags for a
// stream already remembered add to its record. c.mu held.
func (c *conn) noteClosedLocked(id uint32, how closedHow) {
	if c.client || how == 0 {
		return
	}
	h := c.historyLocked()
	if e := h.find(id); e != nil {
		e.how |= how
		return
	}
	h.closed[h.closedNext] = closedStream{id: id, how: how}
	h.closedNext = (h.closedNext + 1) % closedRingLen
}

// openPeerIDLocked makes id, above every identifier the peer used so far,
// its highest, remembering the identifiers it skipped. c.mu held.
func (c *conn) openPeerIDLocked(id uint32) {
	next := c.maxPeerID + 2
	if c.maxPeerID == 0 {
		next = 1
	}
	if id > next {
		h := c.historyLocked()
		h.skipped[h.skipNext] = idRange{lo: next, hi: id - 2}
		h.skipNext = (h.skipNext + 1) % skipRingLen
	}
	c.maxPeerID = id
}

func (c *conn) historyLocked() *streamHistory {
	if c.hist == nil {
		c.hist = new(streamHistory)
	}
	return c.hist
}

// skippedLocked reports whether id is an identifier the peer skipped
// (never opened, below one it opened) as far as the history knows. c.mu
// held.
func (c *conn) skippedLocked(id uint32) bool {
	if c.client || c.hist == nil || id%2 == 0 {
		return false
	}
	for _, r := range c.hist.skipped {
		if r.lo != 0 && r.lo <= id && id <= r.hi {
			return true
		}
	}
	return false
}

// closedHowLocked returns how server stream id closed, 0 if the history
// does not know. c.mu held.
func (c *conn) closedHowLocked(id uint32) closedHow {
	if c.client || c.hist == nil {
		return 0
	}
	if e := c.hist.find(id); e != nil {
		return e.how
	}
	return 0
}

func (h *streamHistory) find(id uint32) *closedStream {
	for i := range h.closed {
		if h.closed[i].id == id {
			return &h.closed[i]
		}
	}
	return nil
}

// peerDone reports whether the peer itself ended or reset the stream:
// then it knows the stream is over, and DATA or HEADERS from it cannot be
// frames that crossed ours (RFC 9113 section 5.1, half-closed (remote)
// and closed).
func (how closedHow) peerDone() bool { return how&(closedPeerEnded|closedPeerReset) != 0 }
