package hbone

import (
	"fmt"
	"io"
	"sync"

	"golang.org/x/net/http2"
)

// The read pump: received plaintext goes into c.in, and step processes what
// c.in holds, frame by frame, without ever waiting for more. A DATA frame is
// delivered as far as its payload is present; any other frame once it is
// whole (a header block with all its CONTINUATIONs). What feeds c.in is the
// driver's business (driver.go): the goroutine driver's reader makes one
// blocking Read per fill; the loop driver reads only when the socket is
// readable. Because step never blocks, both drive the same parser.

// Read buffer size classes. A fill at a frame boundary reads into a small
// buffer: what a round trip's few frames need, and as bufio did, no more
// than the start of a large DATA payload, whose rest then goes straight
// into the stream's buffer (fillStream) or, when the stream's DirectSink
// may take it, through a large buffer. A frame that must be whole and is
// larger gets a buffer of its own size (at most MaxFrameSize+9, or a
// header block's budget). The buffer goes back to its pool whenever it is
// empty.
const (
	inSmallSize = 4 << 10
	inLargeSize = 64 << 10
)

// readBuf is the received plaintext the pump has yet to process,
// buf.b[r:w]. buf is nil when that is empty: an idle connection pins no
// read buffer. Whichever driver reads owns it (the reader goroutine, or
// the event loop inside its callbacks).
type readBuf struct {
	buf  *inBuf
	r, w int
	need int   // bytes from r the pump needs before it can progress
	err  error // the transport's read error, returned once buf is processed
}

// peek returns the n bytes from r, which the buffer holds; nil when n is
// 0 (buf may be released then).
func (rb *readBuf) peek(n int) []byte {
	if n == 0 {
		return nil
	}
	return rb.buf.b[rb.r : rb.r+n]
}

// eat consumes n bytes and releases the buffer once empty.
func (rb *readBuf) eat(n int) {
	rb.r += n
	if rb.r == rb.w {
		rb.release()
	}
}

// release returns the buffer to its pool, dropping what it holds.
func (rb *readBuf) release() {
	if rb.buf != nil {
		putInBuf(rb.buf)
		rb.buf = nil
	}
	rb.r, rb.w = 0, 0
}

// releaseIfEmpty releases the buffer if it holds nothing.
func (rb *readBuf) releaseIfEmpty() {
	if rb.r == rb.w {
		rb.release()
	}
}

// room readies the buffer for one read with room for at least need
// bytes from r (and one more than it holds), and returns its free tail: a
// fresh buffer of the size class (large: a large one even for a small
// need), a larger one when it is short, or what is left moved to the
// front. A larger one is at least twice as large, up to limit: doubling
// bounds the copies of a header block that arrives in many pieces, each
// needing more.
func (rb *readBuf) room(large bool, limit int) []byte {
	avail := rb.w - rb.r
	need := max(rb.need, avail+1)
	size := inSmallSize
	switch {
	case need > inLargeSize:
		size = need
	case need > inSmallSize || large:
		size = inLargeSize
	}
	switch {
	case rb.buf == nil:
		rb.buf = getInBuf(size)
	case need > len(rb.buf.b):
		nb := getInBuf(max(size, min(2*len(rb.buf.b), limit)))
		copy(nb.b, rb.buf.b[rb.r:rb.w])
		putInBuf(rb.buf)
		rb.buf, rb.r, rb.w = nb, 0, avail
	case rb.r > 0:
		// What is left is part of one frame: move it to the front.
		copy(rb.buf.b, rb.buf.b[rb.r:rb.w])
		rb.r, rb.w = 0, avail
	}
	return rb.buf.b[rb.w:]
}

// inBuf is a read buffer; pooled by pointer so Put does not allocate.
type inBuf struct {
	b []byte
}

var (
	inSmall = sync.Pool{New: func() any { return &inBuf{b: make([]byte, inSmallSize)} }}
	inLarge = sync.Pool{New: func() any { return &inBuf{b: make([]byte, inLargeSize)} }}
)

func getInBuf(size int) *inBuf {
	switch {
	case size <= inSmallSize:
		return inSmall.Get().(*inBuf)
	case size <= inLargeSize:
		return inLarge.Get().(*inBuf)
	}
	return &inBuf{b: make([]byte, size)}
}

func putInBuf(b *inBuf) {
	switch len(b.b) {
	case inSmallSize:
		inSmall.Put(b)
	case inLargeSize:
		inLarge.Put(b)
	}
	// Larger ones were made for one oversized frame: let them go.
}

// pumpState is where the pump is in the byte stream.
type pumpState uint8

const (
	stPreface pumpState = iota // server: the client's connection preface
	stHeader                   // the next frame header
	stFrame                    // c.fh is read; its payload (or header block) is awaited
	stData                     // inside a DATA frame's payload (c.data)
)

// frameSrc is the framer's reader: the bytes of c.in the pump hands it,
// one frame header, frame or header block at a time. While a header block
// is read (left >= 0) it lets at most left more bytes through, so a peer
// cannot make the reader decode an endless run of CONTINUATION frames.
type frameSrc struct {
	b        []byte
	n        int  // bytes of b read
	left     int  // bytes the current header block may still take; -1: no block
	exceeded bool // the budget ran out: the peer's block was too large
}

func (r *frameSrc) Read(p []byte) (int, error) {
	if r.left >= 0 {
		if r.left == 0 {
			r.exceeded = true
			return 0, errHeaderBlockTooLarge
		}
		if len(p) > r.left {
			p = p[:r.left]
		}
	}
	if r.n == len(r.b) {
		// The pump hands over every byte the framer can read: reaching
		// the end is a bug, reported as a malformed frame.
		return 0, io.ErrUnexpectedEOF
	}
	k := copy(p, r.b[r.n:])
	r.n += k
	if r.left >= 0 {
		r.left -= k
	}
	return k, nil
}

// blockScan is how far the pump has checked a header block that arrives in
// pieces, so each fill resumes the scan instead of redoing it.
type blockScan struct {
	pos  int  // bytes of the block checked, from the HEADERS payload's start
	left int  // header block budget left after pos
	seen bool // the HEADERS payload itself is checked
	end  bool // the framer reads no further than pos
}

// frameHeader decodes a raw frame header.
func frameHeader(h []byte) (length int, t http2.FrameType, flags http2.Flags, id uint32) {
	length = int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	id = (uint32(h[5])<<24 | uint32(h[6])<<16 | uint32(h[7])<<8 | uint32(h[8])) & maxStreamID
	return length, http2.FrameType(h[3]), http2.Flags(h[4]), id
}

// headersUnparsable reports whether the framer rejects HEADERS payload p
// before it reads any CONTINUATION (x/net's parseHeadersFrame): the block
// then ends with this frame.
func headersUnparsable(fh http2.FrameHeader, p []byte) bool {
	if fh.StreamID == 0 {
		return true
	}
	off, pad := 0, 0
	if fh.Flags.Has(http2.FlagHeadersPadded) {
		if len(p) < 1 {
			return true
		}
		off, pad = 1, int(p[0])
	}
	if fh.Flags.Has(http2.FlagHeadersPriority) {
		off += 5
	}
	return len(p)-off-pad < 0
}

// blockNeed returns how many bytes from c.in.r the framer reads for the
// header block the HEADERS frame fh starts, and whether c.in holds them. It
// follows the framer's reads: the HEADERS payload, then each CONTINUATION
// until END_HEADERS; a frame header the framer rejects (too large, not a
// CONTINUATION of the stream) ends it, and so does the budget
// (MaxHeaderBlockSize, the frame headers included): then the framer reads
// up to the budget and fails.
func (c *conn) blockNeed(fh http2.FrameHeader) (int, bool) {
	sc := &c.scan
	var b []byte
	if c.in.buf != nil {
		b = c.in.buf.b[c.in.r:c.in.w]
	}
	if !sc.seen {
		n := int(fh.Length)
		if n > sc.left {
			return sc.left, sc.left <= len(b)
		}
		if n > len(b) {
			return n, false
		}
		sc.pos, sc.left, sc.seen = n, sc.left-n, true
		sc.end = fh.Flags.Has(http2.FlagHeadersEndHeaders) || headersUnparsable(fh, b[:n])
	}
	for !sc.end {
		if sc.left < frameHeaderLen {
			return sc.pos + sc.left, sc.pos+sc.left <= len(b)
		}
		if sc.pos+frameHeaderLen > len(b) {
			return sc.pos + frameHeaderLen, false
		}
		length, t, flags, id := frameHeader(b[sc.pos:])
		if length > int(c.cfg.MaxFrameSize) || t != http2.FrameContinuation || id != fh.StreamID {
			return sc.pos + frameHeaderLen, true
		}
		if n := frameHeaderLen + length; n > sc.left {
			return sc.pos + sc.left, sc.pos+sc.left <= len(b)
		} else if sc.pos+n > len(b) {
			return sc.pos + n, false
		}
		sc.pos += frameHeaderLen + length
		sc.left -= frameHeaderLen + length
		sc.end = flags.Has(http2.FlagHeadersEndHeaders)
	}
	return sc.pos, sc.pos <= len(b)
}

// wait records that the pump needs need bytes from c.in.r to progress and
// reports no progress.
func (c *conn) wait(need int) (bool, error) {
	c.in.need = need
	return false, nil
}

// readRoom readies c.in for one read with room for at least what the
// pump said it needs, and returns its free tail. Both drivers' reads go
// through it (goDriver.fill, loopDriver.tryFill), so they manage the
// buffer alike.
func (c *conn) readRoom() []byte {
	// Inside a large DATA payload, a fresh buffer is a large one.
	large := c.state == stData && c.data.left+c.data.pad > inSmallSize
	return c.in.room(large, max(int(c.cfg.MaxFrameSize), int(c.cfg.MaxHeaderBlockSize))+frameHeaderLen)
}

// readErr is the error that ends the connection after a failed fill.
func (c *conn) readErr(err error) error {
	c.abortData()
	if c.state == stPreface {
		if err == io.EOF && c.in.w > c.in.r {
			err = io.ErrUnexpectedEOF // as io.ReadFull says it
		}
		return fmt.Errorf("hbone: reading preface: %w", err)
	}
	return fmt.Errorf("hbone: read: %w", err)
}

// step processes what c.in holds: the preface, a frame header, a frame
// once whole, or as much of a DATA payload as is present. It never reads
// the network. progress is false when it needs more bytes (c.in.need says
// how many from c.in.r); err ends the connection: a *ConnError (answered
// with GOAWAY) or ErrBadPreface.
func (c *conn) step() (progress bool, err error) {
	switch c.state {
	case stPreface:
		return c.stepPreface()
	case stHeader:
		return c.stepHeader()
	case stFrame:
		return c.stepFrame()
	}
	return c.stepData()
}

func (c *conn) stepPreface() (bool, error) {
	n := len(http2.ClientPreface)
	if c.in.w-c.in.r < n {
		return c.wait(n)
	}
	ok := string(c.in.buf.b[c.in.r:c.in.r+n]) == http2.ClientPreface
	if !ok {
		return false, ErrBadPreface
	}
	c.in.eat(n)
	c.state = stHeader
	return true, nil
}

func (c *conn) stepHeader() (bool, error) {
	if c.in.w-c.in.r < frameHeaderLen {
		return c.wait(frameHeaderLen)
	}
	c.src = frameSrc{b: c.in.peek(frameHeaderLen), left: -1}
	fh, err := c.fr.ReadFrameHeader()
	c.src.b = nil
	c.in.eat(frameHeaderLen)
	if err != nil {
		return true, c.frameError(fh, err)
	}
	if !c.gotSettings {
		// RFC 9113 section 3.4: the peer's preface ends with SETTINGS. A
		// GOAWAY instead still tells why the peer is leaving.
		if fh.Type != http2.FrameGoAway && (fh.Type != http2.FrameSettings || fh.Flags.Has(http2.FlagSettingsAck)) {
			return true, connError(http2.ErrCodeProtocol, "first frame is %v, not SETTINGS", fh.Type)
		}
		c.gotSettings = true
	}
	switch fh.Type {
	case http2.FrameData:
		if fh.StreamID == 0 {
			return true, connError(http2.ErrCodeProtocol, "DATA on stream 0")
		}
		if fh.Flags.Has(http2.FlagDataPadded) && fh.Length == 0 {
			return true, connError(http2.ErrCodeFrameSize, "padded DATA frame without pad length")
		}
	case http2.FramePriority:
		if fh.StreamID == 0 {
			return true, connError(http2.ErrCodeProtocol, "PRIORITY on stream 0")
		}
	case http2.FrameHeaders:
		c.scan = blockScan{left: int(c.cfg.MaxHeaderBlockSize) - frameHeaderLen}
	}
	c.fh = fh
	c.state = stFrame
	return true, nil
}

func (c *conn) stepFrame() (bool, error) {
	fh := c.fh
	avail := c.in.w - c.in.r
	switch fh.Type {
	case http2.FrameData:
		padLen := 0
		if fh.Flags.Has(http2.FlagDataPadded) {
			if avail < 1 {
				return c.wait(1)
			}
			padLen = int(c.in.buf.b[c.in.r])
			c.in.eat(1)
		}
		return true, c.readData(fh, padLen)
	case http2.FramePriority:
		n := int(fh.Length)
		if avail < n {
			return c.wait(n)
		}
		err := c.readPriority(fh, c.in.peek(n))
		c.in.eat(n)
		c.state = stHeader
		return true, err
	}
	n, left := int(fh.Length), -1
	if fh.Type == http2.FrameHeaders {
		var whole bool
		if n, whole = c.blockNeed(fh); !whole {
			return c.wait(n)
		}
		// Each frame of the block, after the HEADERS frame's own header,
		// counts against MaxHeaderBlockSize.
		left = int(c.cfg.MaxHeaderBlockSize) - frameHeaderLen
	} else if avail < n {
		return c.wait(n)
	}
	c.src = frameSrc{b: c.in.peek(n), left: left}
	f, err := c.fr.ReadFrameForHeader(fh)
	used := c.src.n
	c.src.b = nil
	if used > 0 {
		c.in.eat(used)
	}
	c.state = stHeader
	if err != nil {
		return true, c.frameError(fh, err)
	}
	if err := c.handleFrame(f); err != nil {
		return true, err
	}
	// Whatever the frame provoked must not pile up unread.
	return true, c.checkBacklog()
}
