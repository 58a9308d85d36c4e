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
// driver's business: the reader goroutine (readFrames) makes one blocking
// Read per fill. Because step never blocks, the same parser can be driven
// by an event loop that reads only when the socket is readable.

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

// setSrc points the framer at n bytes of c.in from c.inR.
func (c *conn) setSrc(n, left int) {
	c.src = frameSrc{b: c.peekIn(n), left: left}
}

// peekIn returns the n bytes of c.in from c.inR, which it holds; nil
// when n is 0 (c.in may be released then).
func (c *conn) peekIn(n int) []byte {
	if n == 0 {
		return nil
	}
	return c.in.b[c.inR : c.inR+n]
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

// blockNeed returns how many bytes from c.inR the framer reads for the
// header block the HEADERS frame fh starts, and whether c.in holds them. It
// follows the framer's reads: the HEADERS payload, then each CONTINUATION
// until END_HEADERS; a frame header the framer rejects (too large, not a
// CONTINUATION of the stream) ends it, and so does the budget
// (MaxHeaderBlockSize, the frame headers included): then the framer reads
// up to the budget and fails.
func (c *conn) blockNeed(fh http2.FrameHeader) (int, bool) {
	sc := &c.scan
	var b []byte
	if c.in != nil {
		b = c.in.b[c.inR:c.inW]
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

// eat consumes n bytes of c.in and releases it once empty.
func (c *conn) eat(n int) {
	c.inR += n
	if c.inR == c.inW {
		c.releaseIn()
	}
}

// releaseIn returns c.in to its pool, dropping what it holds.
func (c *conn) releaseIn() {
	if c.in != nil {
		putInBuf(c.in)
		c.in = nil
	}
	c.inR, c.inW = 0, 0
}

// wait records that the pump needs need bytes from c.inR to progress and
// reports no progress.
func (c *conn) wait(need int) (bool, error) {
	c.inNeed = need
	return false, nil
}

// inSize is the buffer size class for a fill that needs need bytes.
func (c *conn) inSize(need int) int {
	if need > inLargeSize {
		return need
	}
	if need > inSmallSize || (c.state == stData && c.data.left+c.data.pad > inSmallSize) {
		return inLargeSize
	}
	return inSmallSize
}

// readRoom readies c.in for one read with room for at least what the
// pump said it needs, and returns its free tail. Both drivers' reads
// (fill, tryFill) go through it, so they manage the buffer alike.
func (c *conn) readRoom() []byte {
	avail := c.inW - c.inR
	need := max(c.inNeed, avail+1)
	switch {
	case c.in == nil:
		c.in = getInBuf(c.inSize(need))
	case need > len(c.in.b):
		// Doubling bounds the copies of a header block that arrives in
		// many pieces, each needing more.
		limit := max(int(c.cfg.MaxFrameSize), int(c.cfg.MaxHeaderBlockSize)) + frameHeaderLen
		nb := getInBuf(max(c.inSize(need), need, min(2*len(c.in.b), limit)))
		copy(nb.b, c.in.b[c.inR:c.inW])
		putInBuf(c.in)
		c.in, c.inR, c.inW = nb, 0, avail
	case c.inR > 0:
		// What is left is part of one frame: move it to the front.
		copy(c.in.b, c.in.b[c.inR:c.inW])
		c.inR, c.inW = 0, avail
	}
	return c.in.b[c.inW:]
}

// fill is the goroutine driver's read: one blocking Read into c.in's tail,
// with room for at least what the pump said it needs. A read error is kept
// and returned once what came before it is processed (the caller steps
// until no progress, then fills again).
func (c *conn) fill() error {
	if c.inErr != nil {
		return c.inErr
	}
	if c.in == nil && c.state == stData && c.data.s != nil && c.data.left >= inSmallSize {
		if done, err := c.fillStream(&c.data); done {
			return err
		}
	}
	space := c.readRoom()
	for range 100 { // as bufio: a transport that keeps returning nothing is broken
		n, err := c.nc.Read(space)
		c.inW += n
		if err != nil {
			c.inErr = err
			if n == 0 {
				c.releaseIfEmpty()
				return err
			}
		}
		if n > 0 {
			return nil
		}
	}
	c.inErr = io.ErrNoProgress
	return c.inErr
}

// fillStream is fill in the middle of a large DATA payload that no
// DirectSink can take now: the read goes straight into the stream's buffer
// (as far as the payload goes), saving the copy through c.in. It runs
// outside s.mu, so the stream's reader keeps draining older data
// meanwhile; s.filling keeps the tail chunk alive until the read is done.
// done is false when the stream's sink may take the bytes or the stream
// was reset: then the bytes go through c.in.
func (c *conn) fillStream(d *dataState) (done bool, err error) {
	s := d.s
	s.mu.Lock()
	if ref := s.waker.Load(); s.rerrNow != nil || (ref != nil && ref.sink != nil && s.rbuf.size == 0) {
		s.mu.Unlock()
		return false, nil
	}
	dst := s.rbuf.reserve(d.left)
	s.filling = true
	s.mu.Unlock()
	n, err := c.nc.Read(dst)
	s.mu.Lock()
	s.filling = false
	if s.rerrNow != nil {
		if !s.peeking {
			s.rbuf.free() // else the Consume that ends the Peek does
		}
		d.dropped += n
	} else if n > 0 {
		s.rbuf.commit(n)
		s.wakeReaderLocked()
		s.wake()
	}
	if n == 0 && s.rbuf.size == 0 && !s.peeking {
		s.rbuf.free() // the chunk reserved for nothing
	}
	s.mu.Unlock()
	d.left -= n
	if err != nil {
		c.inErr = err
		if n == 0 {
			return true, err
		}
	}
	return true, nil
}

// releaseIfEmpty releases c.in if it holds nothing.
func (c *conn) releaseIfEmpty() {
	if c.inR == c.inW {
		c.releaseIn()
	}
}

// readErr is the error that ends the connection after a failed fill.
func (c *conn) readErr(err error) error {
	c.abortData()
	if c.state == stPreface {
		if err == io.EOF && c.inW > c.inR {
			err = io.ErrUnexpectedEOF // as io.ReadFull says it
		}
		return fmt.Errorf("hbone: reading preface: %w", err)
	}
	return fmt.Errorf("hbone: read: %w", err)
}

// step processes what c.in holds: the preface, a frame header, a frame
// once whole, or as much of a DATA payload as is present. It never reads
// the network. progress is false when it needs more bytes (c.inNeed says
// how many from c.inR); err ends the connection, as readFrames documents.
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
	if c.inW-c.inR < n {
		return c.wait(n)
	}
	ok := string(c.in.b[c.inR:c.inR+n]) == http2.ClientPreface
	if !ok {
		return false, ErrBadPreface
	}
	c.eat(n)
	c.state = stHeader
	return true, nil
}

func (c *conn) stepHeader() (bool, error) {
	if c.inW-c.inR < frameHeaderLen {
		return c.wait(frameHeaderLen)
	}
	c.setSrc(frameHeaderLen, -1)
	fh, err := c.fr.ReadFrameHeader()
	c.src.b = nil
	c.eat(frameHeaderLen)
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
	avail := c.inW - c.inR
	switch fh.Type {
	case http2.FrameData:
		padLen := 0
		if fh.Flags.Has(http2.FlagDataPadded) {
			if avail < 1 {
				return c.wait(1)
			}
			padLen = int(c.in.b[c.inR])
			c.eat(1)
		}
		return true, c.readData(fh, padLen)
	case http2.FramePriority:
		n := int(fh.Length)
		if avail < n {
			return c.wait(n)
		}
		err := c.readPriority(fh, c.peekIn(n))
		c.eat(n)
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
	c.src = frameSrc{b: c.peekIn(n), left: left}
	f, err := c.fr.ReadFrameForHeader(fh)
	used := c.src.n
	c.src.b = nil
	if used > 0 {
		c.eat(used)
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
