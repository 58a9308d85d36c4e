package hbone

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/net/http2"
)

// netReader remembers the first error of the underlying connection, which
// tells network failures apart from malformed frames.
type netReader struct {
	nc  net.Conn
	err error
}

func (r *netReader) Read(p []byte) (int, error) {
	n, err := r.nc.Read(p)
	if err != nil && r.err == nil {
		r.err = err
	}
	return n, err
}

// blockReader is the framer's reader. While a header block is being read
// (left >= 0) it lets at most left more bytes through, so a peer cannot make
// the reader decode an endless run of CONTINUATION frames.
type blockReader struct {
	r        *bufio.Reader
	left     int64 // bytes the current header block may still take; -1: no block
	exceeded bool  // the budget ran out: the peer's block was too large
}

func (b *blockReader) Read(p []byte) (int, error) {
	if b.left < 0 {
		return b.r.Read(p)
	}
	if b.left == 0 {
		b.exceeded = true
		return 0, errHeaderBlockTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// readFrames is the reader goroutine's loop. It returns why the connection
// must end: a *ConnError (answered with GOAWAY), a network error, or
// ErrBadPreface.
func (c *conn) readFrames() error {
	if !c.client {
		var preface [len(http2.ClientPreface)]byte
		if _, err := io.ReadFull(c.br, preface[:]); err != nil {
			if c.nr.err != nil {
				return fmt.Errorf("hbone: reading preface: %w", err)
			}
			return ErrBadPreface
		}
		if string(preface[:]) != http2.ClientPreface {
			return ErrBadPreface
		}
	}
	for {
		fh, err := c.fr.ReadFrameHeader()
		if err != nil {
			return c.frameError(fh, err)
		}
		if !c.gotSettings {
			// RFC 9113 section 3.4: the peer's preface ends with SETTINGS. A
			// GOAWAY instead still tells why the peer is leaving.
			if fh.Type != http2.FrameGoAway && (fh.Type != http2.FrameSettings || fh.Flags.Has(http2.FlagSettingsAck)) {
				return connError(http2.ErrCodeProtocol, "first frame is %v, not SETTINGS", fh.Type)
			}
			c.gotSettings = true
		}
		switch fh.Type {
		case http2.FrameData:
			err = c.readData(fh)
		case http2.FramePriority:
			err = c.readPriority(fh)
		default:
			if fh.Type == http2.FrameHeaders {
				// The framer reads the whole block, CONTINUATIONs included.
				c.hr.left = int64(c.cfg.MaxHeaderBlockSize) - frameHeaderLen
			}
			var f http2.Frame
			f, err = c.fr.ReadFrameForHeader(fh)
			c.hr.left = -1
			if err != nil {
				err = c.frameError(fh, err)
			} else {
				err = c.handleFrame(f)
			}
			if err == nil {
				// Whatever the frame provoked must not pile up unread.
				err = c.checkBacklog()
			}
		}
		if err != nil {
			return err
		}
	}
}

// frameError classifies an error of the framer. Stream errors reset the
// stream and return nil; anything else ends the connection.
func (c *conn) frameError(fh http2.FrameHeader, err error) error {
	if c.nr.err != nil {
		return fmt.Errorf("hbone: read: %w", c.nr.err)
	}
	if c.hr.exceeded {
		return connError(http2.ErrCodeEnhanceYourCalm, "header block on stream %d exceeds %d bytes", fh.StreamID, c.cfg.MaxHeaderBlockSize)
	}
	if errors.Is(err, http2.ErrFrameTooLarge) {
		return connError(http2.ErrCodeFrameSize, "%v frame of %d bytes exceeds %d", fh.Type, fh.Length, c.cfg.MaxFrameSize)
	}
	var ce http2.ConnectionError
	if errors.As(err, &ce) {
		reason := "malformed frame"
		if d := c.fr.ErrorDetail(); d != nil {
			reason = d.Error()
		}
		return connError(http2.ErrCode(ce), "%s", reason)
	}
	var se http2.StreamError
	if errors.As(err, &se) {
		if (fh.Type == http2.FrameHeaders || fh.Type == http2.FrameContinuation) && se.Cause == nil {
			// Rejected before HPACK decoding: the compression state is lost.
			return connError(http2.ErrCodeProtocol, "malformed %v frame", fh.Type)
		}
		return c.rejectStream(se.StreamID, se.Code, fh.Type)
	}
	return connError(http2.ErrCodeProtocol, "malformed %v frame: %v", fh.Type, err)
}

// rejectStream resets stream id after a stream-level error found by the
// framer in a frame of type t.
func (c *conn) rejectStream(id uint32, code http2.ErrCode, t http2.FrameType) error {
	c.mu.Lock()
	s := c.streams[id]
	if s == nil {
		switch {
		case t == http2.FrameHeaders && !c.client && id%2 == 1 && id > c.maxPeerID:
			c.openPeerIDLocked(id) // the malformed request opened (and closes) it
			c.noteClosedLocked(id, closedLocalReset)
		case t != http2.FrameHeaders && t != http2.FramePriority && c.idleLocked(id):
			// PRIORITY may name any stream, idle ones included (RFC 9113
			// section 5.1); other frames on an idle stream break the
			// connection.
			c.mu.Unlock()
			return connError(http2.ErrCodeProtocol, "%v frame on idle stream %d", t, id)
		}
		c.wmu.Lock()
		c.queueRSTLocked(id, code)
		c.wmu.Unlock()
		c.mu.Unlock()
		return c.spendReset()
	}
	c.mu.Unlock()
	c.streamError(s, code)
	return c.spendReset()
}

// rstClosed answers a frame on a stream that is no longer open with
// RST_STREAM(code), charged to the peer's reset budget. Reader goroutine.
func (c *conn) rstClosed(id uint32, code http2.ErrCode) error {
	c.wmu.Lock()
	c.queueRSTLocked(id, code)
	c.wmu.Unlock()
	return c.spendReset()
}

// spendReset charges one wasted stream (see Config.MaxResetStreams) to the
// peer and ends the connection once its budget is gone. Server reader
// goroutine only; clients do not count.
func (c *conn) spendReset() error {
	if c.client {
		return nil
	}
	now := time.Now()
	limit := float64(c.cfg.MaxResetStreams)
	if !c.resetStamp.IsZero() {
		refill := now.Sub(c.resetStamp).Seconds() / c.cfg.ResetWindow.Seconds() * limit
		c.resetTokens = min(c.resetTokens+refill, limit)
	}
	c.resetStamp = now
	c.resetTokens--
	if c.resetTokens < 0 {
		return connError(http2.ErrCodeEnhanceYourCalm, "more than %d streams reset, refused or rejected within %v", c.cfg.MaxResetStreams, c.cfg.ResetWindow)
	}
	return nil
}

func (c *conn) handleFrame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		if c.client {
			return c.handleResponseHeaders(f)
		}
		return c.handleRequestHeaders(f)
	case *http2.SettingsFrame:
		return c.handleSettings(f)
	case *http2.WindowUpdateFrame:
		return c.handleWindowUpdate(f)
	case *http2.PingFrame:
		return c.handlePing(f)
	case *http2.RSTStreamFrame:
		return c.handleRSTStream(f)
	case *http2.GoAwayFrame:
		return c.handleGoAway(f)
	case *http2.PushPromiseFrame:
		// Clients disable push; servers never accept it.
		return connError(http2.ErrCodeProtocol, "unexpected PUSH_PROMISE")
	}
	// PRIORITY (deprecated by RFC 9113), PRIORITY_UPDATE and unknown frame
	// types are ignored.
	return nil
}

// readPriority skips a PRIORITY frame. RFC 9113 deprecates the signal but
// keeps its framing rules (section 6.3): stream 0 is a connection error, a
// length other than 5 a stream error (the framer would end the connection),
// and so is a stream depending on itself (RFC 7540 section 5.3.1). PRIORITY
// may name a stream in any state.
func (c *conn) readPriority(fh http2.FrameHeader) error {
	if fh.StreamID == 0 {
		return connError(http2.ErrCodeProtocol, "PRIORITY on stream 0")
	}
	if fh.Length != 5 {
		if _, err := c.br.Discard(int(fh.Length)); err != nil {
			return fmt.Errorf("hbone: read: %w", err)
		}
		return c.rejectStream(fh.StreamID, http2.ErrCodeFrameSize, http2.FramePriority)
	}
	var p [5]byte
	if _, err := io.ReadFull(c.br, p[:]); err != nil {
		return fmt.Errorf("hbone: read: %w", err)
	}
	if binary.BigEndian.Uint32(p[:4])&maxStreamID == fh.StreamID {
		return c.rejectStream(fh.StreamID, http2.ErrCodeProtocol, http2.FramePriority)
	}
	return nil
}

// readData reads a DATA frame's payload straight into the stream's buffer.
func (c *conn) readData(fh http2.FrameHeader) error {
	id := fh.StreamID
	if id == 0 {
		return connError(http2.ErrCodeProtocol, "DATA on stream 0")
	}
	frameLen := int(fh.Length)
	dataLen, padLen := frameLen, 0
	if fh.Flags.Has(http2.FlagDataPadded) {
		if frameLen == 0 {
			return connError(http2.ErrCodeFrameSize, "padded DATA frame without pad length")
		}
		p, err := c.br.ReadByte()
		if err != nil {
			return fmt.Errorf("hbone: read: %w", err)
		}
		padLen = int(p)
		if padLen >= frameLen {
			return connError(http2.ErrCodeProtocol, "DATA padding of %d bytes in a %d-byte frame", padLen, frameLen)
		}
		dataLen = frameLen - 1 - padLen
	}
	// Connection flow control covers the whole frame, padding included.
	if c.recvConnAvail.Add(-int64(frameLen)) < 0 {
		return connError(http2.ErrCodeFlowControl, "DATA exceeds the connection window")
	}
	end := fh.Flags.Has(http2.FlagDataEndStream)

	c.mu.Lock()
	s := c.streams[id]
	var code http2.ErrCode
	switch {
	case s == nil:
		idle, skipped, how := c.idleLocked(id), c.skippedLocked(id), c.closedHowLocked(id)
		c.mu.Unlock()
		if idle || skipped {
			// Section 5.1.1: the client never opened it.
			return connError(http2.ErrCodeProtocol, "DATA on stream %d, which the peer never opened", id)
		}
		if err := c.skipData(dataLen+padLen, frameLen); err != nil {
			return err
		}
		if how.peerDone() {
			// RFC 9113 section 5.1: the client ended or reset the stream
			// itself, so this DATA did not cross our RST_STREAM.
			return c.rstClosed(id, http2.ErrCodeStreamClosed)
		}
		// A closed stream: frames may still arrive after our RST_STREAM.
		return nil
	case s.remoteClosed:
		code = http2.ErrCodeStreamClosed
	case c.client && !s.gotResponse:
		code = http2.ErrCodeProtocol // DATA before the response HEADERS
	}
	if code != 0 {
		c.mu.Unlock()
		if err := c.skipData(dataLen+padLen, frameLen); err != nil {
			return err
		}
		c.streamError(s, code)
		return c.spendReset()
	}
	if end {
		s.remoteClosed = true
		c.maybeFinishLocked(s)
	}
	c.unlock()
	return c.fillStream(s, dataLen, padLen, frameLen, end)
}

// skipData discards a payload nobody will read and returns its connection
// window at once.
func (c *conn) skipData(n, frameLen int) error {
	if _, err := c.br.Discard(n); err != nil {
		return fmt.Errorf("hbone: read: %w", err)
	}
	c.consumed(frameLen)
	return nil
}

// fillStream moves dataLen payload bytes into s's buffer. The network read
// happens outside s.mu, so the stream's reader keeps draining older data
// meanwhile; s.filling keeps the tail chunk alive until the fill is done.
func (c *conn) fillStream(s *Stream, dataLen, padLen, frameLen int, end bool) error {
	s.mu.Lock()
	if int64(frameLen) > s.recvWindow {
		s.mu.Unlock()
		if err := c.skipData(dataLen+padLen, frameLen); err != nil {
			return err
		}
		c.streamError(s, http2.ErrCodeFlowControl)
		return c.spendReset()
	}
	s.recvWindow -= int64(frameLen)
	// The pad length byte and padding are never buffered: their window goes
	// back right away.
	overhead := frameLen - dataLen
	var dropped int // payload read but not kept: the stream was reset meanwhile
	var rerr error
	var inc int64
	// Straight to the relay's socket when it can take it (DirectSink);
	// then the bytes count as read at once.
	direct := c.deliverLocked(s, dataLen)
	if direct > 0 {
		dataLen -= direct
		inc = s.creditLocked(direct)
	}
	for dataLen > 0 {
		if s.rerrNow != nil {
			s.mu.Unlock()
			_, rerr = c.br.Discard(dataLen)
			dropped += dataLen
			s.mu.Lock()
			break
		}
		dst := s.rbuf.reserve(dataLen)
		s.filling = true
		s.mu.Unlock()
		n, err := c.br.Read(dst)
		s.mu.Lock()
		s.filling = false
		if s.rerrNow != nil {
			if !s.peeking {
				s.rbuf.free() // else the Consume that ends the Peek does
			}
			dropped += n
		} else if n > 0 {
			s.rbuf.commit(n)
			s.wakeReaderLocked()
			s.wake()
		}
		dataLen -= n
		if err != nil {
			rerr = err
			break
		}
	}
	if rerr != nil {
		if s.rbuf.size == 0 && !s.peeking {
			s.rbuf.free()
		}
		s.mu.Unlock()
		c.consumed(dropped + direct)
		return fmt.Errorf("hbone: read: %w", rerr)
	}
	if end && s.rerrAfter == nil {
		s.rerrAfter = io.EOF
		s.wakeReaderLocked()
		s.wake()
	}
	if overhead > 0 && s.rerrAfter == nil && s.rerrNow == nil {
		inc += s.creditLocked(overhead)
	}
	s.mu.Unlock()
	if padLen > 0 {
		if _, err := c.br.Discard(padLen); err != nil {
			return fmt.Errorf("hbone: read: %w", err)
		}
	}
	c.consumed(dropped + overhead + direct)
	if inc > 0 {
		c.queueStreamWindowUpdate(s, inc)
	}
	return nil
}

func (c *conn) handleSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	maxFrame, tableSize := -1, -1
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				return connError(http2.ErrCode(ce), "invalid setting %v", s)
			}
			return connError(http2.ErrCodeProtocol, "invalid setting %v", s)
		}
		switch s.ID {
		case http2.SettingHeaderTableSize:
			tableSize = int(s.Val)
		case http2.SettingEnablePush:
			if c.client && s.Val != 0 {
				return connError(http2.ErrCodeProtocol, "server sent SETTINGS_ENABLE_PUSH=%d", s.Val)
			}
		case http2.SettingMaxConcurrentStreams:
			c.peerMaxStreams = s.Val
		case http2.SettingInitialWindowSize:
			return c.setPeerInitialWindowLocked(s.Val)
		case http2.SettingMaxFrameSize:
			maxFrame = int(s.Val)
		case http2.SettingMaxHeaderListSize:
			c.peerMaxHeaderList = s.Val
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	// Applied together with queueing the ACK: frames queued before it were
	// sized under the old settings, which the peer must still accept.
	if maxFrame > 0 {
		c.wPeerMaxFrame = maxFrame
	}
	if tableSize >= 0 {
		c.enc.SetMaxDynamicTableSizeLimit(uint32(tableSize))
	}
	if c.wclosing {
		return nil
	}
	if err := c.backlogErrLocked(); err != nil {
		return err
	}
	b := c.wbufLocked()
	b = appendSettingsAck(b)
	c.commitLocked(b)
	return nil
}

func (c *conn) handlePing(f *http2.PingFrame) error {
	if !f.IsAck() {
		return c.queueControl(true, f.Data)
	}
	c.mu.Lock()
	if c.pingOut && f.Data == c.pingData {
		c.pingOut = false
	}
	c.mu.Unlock()
	return nil
}

func (c *conn) handleRSTStream(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	s := c.streams[f.StreamID]
	if s == nil {
		idle := c.idleLocked(f.StreamID) || c.skippedLocked(f.StreamID)
		if !idle {
			// It may have crossed our END_STREAM or RST_STREAM; what the
			// client sends on the stream after it is a fault (section
			// 5.1).
			c.noteClosedLocked(f.StreamID, closedPeerReset)
		}
		c.mu.Unlock()
		if idle {
			return connError(http2.ErrCodeProtocol, "RST_STREAM on idle stream %d", f.StreamID)
		}
		return nil
	}
	err := &StreamError{Code: f.ErrCode}
	graceful := f.ErrCode == http2.ErrCodeNo
	// A server stream reset before its response is a request the client
	// made the server work on for nothing: rapid reset when repeated.
	early := !c.client && s.status == 0
	c.resetLocked(s, f.ErrCode, err, false)
	c.noteClosedLocked(s.id, closedPeerReset)
	c.unlock()
	if graceful {
		// RFC 9113 section 8.1: NO_ERROR after a complete response must not
		// discard it; deliver what arrived, then EOF (or the reset).
		s.endRecv(err)
	} else {
		s.abortRecv(err)
	}
	if early {
		return c.spendReset()
	}
	return nil
}

func (c *conn) handleGoAway(f *http2.GoAwayFrame) error {
	c.mu.Lock()
	c.goAwayRecv = true
	if f.ErrCode != http2.ErrCodeNo {
		c.goAwayErr = &GoAwayError{LastStreamID: f.LastStreamID, Code: f.ErrCode, DebugData: string(f.DebugData())}
		c.logf("hbone: %v sent GOAWAY %v (last stream %d): %q", c.nc.RemoteAddr(), f.ErrCode, f.LastStreamID, f.DebugData())
	}
	var refused []*Stream
	if c.client {
		// Streams above the last ID were not processed: safe to retry.
		for id, s := range c.streams {
			if id > f.LastStreamID {
				c.resetLocked(s, http2.ErrCodeRefusedStream, ErrRefused, false)
				refused = append(refused, s)
			}
		}
	}
	c.slotFreedLocked()
	c.unlock()
	for _, s := range refused {
		s.abortRecv(ErrRefused)
	}
	return nil
}
