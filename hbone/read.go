package hbone

import (
	"encoding/binary"
	"errors"
	"io"
	"time"

	"golang.org/x/net/http2"
)

// frameError classifies an error of the framer. Stream errors reset the
// stream and return nil; anything else ends the connection.
func (c *conn) frameError(fh http2.FrameHeader, err error) error {
	if c.src.exceeded {
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
// RST_STREAM(code), charged to the peer's reset budget. The read path.
func (c *conn) rstClosed(id uint32, code http2.ErrCode) error {
	c.wmu.Lock()
	c.queueRSTLocked(id, code)
	c.wmu.Unlock()
	return c.spendReset()
}

// spendReset charges one wasted stream (see Config.MaxResetStreams) to the
// peer and ends the connection once its budget is gone. The server's read
// path only; clients do not count.
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

// readPriority checks a PRIORITY frame, whose payload p is whole, and
// otherwise ignores it. RFC 9113 deprecates the signal but keeps its
// framing rules (section 6.3): stream 0 is a connection error (checked
// with the header), a length other than 5 a stream error (the framer would
// end the connection), and so is a stream depending on itself (RFC 7540
// section 5.3.1). PRIORITY may name a stream in any state.
func (c *conn) readPriority(fh http2.FrameHeader, p []byte) error {
	if fh.Length != 5 {
		return c.rejectStream(fh.StreamID, http2.ErrCodeFrameSize, http2.FramePriority)
	}
	if binary.BigEndian.Uint32(p[:4])&maxStreamID == fh.StreamID {
		return c.rejectStream(fh.StreamID, http2.ErrCodeProtocol, http2.FramePriority)
	}
	return nil
}

// dataState is the DATA frame whose payload the pump is delivering: the
// checks ran once, with its header and pad length (readData); the payload
// then goes to the stream as it arrives (fillData), and its window and
// end of stream are settled when it is all in (endPayload, endData).
type dataState struct {
	s        *Stream // the stream it fills; nil: the payload is skipped
	id       uint32
	left     int // payload bytes still to come
	pad      int // padding bytes after them
	frameLen int
	overhead int   // the pad length byte and padding: never buffered
	direct   int   // payload bytes the stream's DirectSink took
	dropped  int   // payload read but not kept: the stream was reset meanwhile
	inc      int64 // stream window to return once the frame is in
	end      bool  // END_STREAM
	ended    bool  // the payload is all in and endPayload ran
	// What a skipped payload leads to once it is read: RST_STREAM for a
	// stream the peer had closed, or a stream error on rejected.
	rst      bool
	rejected *Stream
	code     http2.ErrCode
}

// readData runs a DATA frame's checks once its header and pad length are
// read, and sets the pump to deliver or skip its payload.
func (c *conn) readData(fh http2.FrameHeader, padLen int) error {
	id := fh.StreamID
	frameLen := int(fh.Length)
	dataLen := frameLen
	if fh.Flags.Has(http2.FlagDataPadded) {
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
	c.data = dataState{id: id, left: dataLen, pad: padLen, frameLen: frameLen, end: end}
	c.state = stData

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
		// RFC 9113 section 5.1: if the client ended or reset the stream
		// itself, this DATA did not cross our RST_STREAM; on a stream we
		// closed, frames may still arrive after our RST_STREAM.
		c.data.rst = how.peerDone()
		return nil
	case s.remoteClosed:
		code = http2.ErrCodeStreamClosed
	case c.client && !s.gotResponse:
		code = http2.ErrCodeProtocol // DATA before the response HEADERS
	}
	if code != 0 {
		c.mu.Unlock()
		c.data.rejected, c.data.code = s, code
		return nil
	}
	if end {
		s.remoteClosed = true
		c.maybeFinishLocked(s)
	}
	c.unlock()

	s.mu.Lock()
	if int64(frameLen) > s.recvWindow {
		s.mu.Unlock()
		c.data.rejected, c.data.code = s, http2.ErrCodeFlowControl
		return nil
	}
	s.recvWindow -= int64(frameLen)
	s.mu.Unlock()
	c.data.s = s
	// The pad length byte and padding are never buffered: their window
	// goes back once the frame is in.
	c.data.overhead = frameLen - dataLen
	return nil
}

// stepData delivers or skips the part of the current DATA frame that c.in
// holds, and settles the frame once it is all in.
func (c *conn) stepData() (bool, error) {
	d := &c.data
	avail := c.in.w - c.in.r
	progress := false
	if d.left > 0 {
		n := min(avail, d.left)
		if n == 0 {
			return c.wait(1)
		}
		if d.s != nil {
			c.fillData(d, c.in.buf.b[c.in.r:c.in.r+n])
		}
		d.left -= n
		avail -= n
		c.in.eat(n)
		if d.left > 0 {
			return true, nil
		}
		progress = true
	}
	if d.left == 0 && d.s != nil && !d.ended {
		c.endPayload(d)
	}
	if d.pad > 0 {
		n := min(avail, d.pad)
		if n == 0 {
			c.in.need = 1
			return progress, nil
		}
		d.pad -= n
		c.in.eat(n)
		if d.pad > 0 {
			return true, nil
		}
	}
	return true, c.endData()
}

// fillData hands payload bytes p (in c.in) to d's stream: to its
// DirectSink when the stream holds no received byte and the sink takes
// them (they then count as read at once), the rest to its buffer.
func (c *conn) fillData(d *dataState, p []byte) {
	s := d.s
	s.mu.Lock()
	if s.rerrNow != nil {
		s.mu.Unlock()
		d.dropped += len(p)
		return
	}
	// Chunks are sized for the payload still to come (d.left counts p
	// too), so the rest of a large one fills the same chunk.
	want := d.left
	if k := s.deliverLocked(p); k > 0 {
		d.direct += k
		d.inc += s.creditLocked(k)
		p = p[k:]
		want -= k
	}
	if len(p) > 0 {
		for len(p) > 0 {
			k := copy(s.rbuf.reserve(want), p)
			s.rbuf.commit(k)
			p = p[k:]
			want -= k
		}
		s.wakeReaderLocked()
		c.wakeRead(s)
	}
	s.mu.Unlock()
}

// endPayload notes the end of stream once d's payload is all in and takes
// back the window of its padding.
func (c *conn) endPayload(d *dataState) {
	s := d.s
	d.ended = true
	s.mu.Lock()
	if d.end && s.rerrAfter == nil {
		s.rerrAfter = io.EOF
		s.wakeReaderLocked()
		c.wakeRead(s)
	}
	if d.overhead > 0 && s.rerrAfter == nil && s.rerrNow == nil {
		d.inc += s.creditLocked(d.overhead)
	}
	s.mu.Unlock()
}

// endData settles a DATA frame read to its end: the connection window of
// what no stream will read goes back at once; a skipped frame then leads
// to what readData decided.
func (c *conn) endData() error {
	d := c.data
	c.data = dataState{}
	c.state = stHeader
	if d.s == nil {
		c.consumed(d.frameLen)
		switch {
		case d.rst:
			return c.rstClosed(d.id, http2.ErrCodeStreamClosed)
		case d.rejected != nil:
			c.streamError(d.rejected, d.code)
			return c.spendReset()
		}
		return nil
	}
	c.consumed(d.dropped + d.overhead + d.direct)
	if d.inc > 0 {
		c.queueStreamWindowUpdate(d.s, d.inc)
	}
	return nil
}

// abortData returns, when the connection fails inside a DATA payload, the
// window of what was read of it and not buffered.
func (c *conn) abortData() {
	if c.state == stData && c.data.s != nil && !c.data.ended {
		c.consumed(c.data.dropped + c.data.direct)
	}
	c.data = dataState{}
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
