package hbone

import (
	"golang.org/x/net/http2"
)

// Frames are serialized straight into the connection's write buffer rather
// than through http2.Framer, whose writes copy every payload once more.

const frameHeaderLen = 9

func appendFrameHeader(b []byte, length int, t http2.FrameType, flags http2.Flags, streamID uint32) []byte {
	return append(b,
		byte(length>>16), byte(length>>8), byte(length),
		byte(t), byte(flags),
		byte(streamID>>24)&0x7f, byte(streamID>>16), byte(streamID>>8), byte(streamID))
}

func appendUint32(b []byte, v uint32) []byte {
	return append(b, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

func appendData(b []byte, streamID uint32, end bool, p []byte) []byte {
	var flags http2.Flags
	if end {
		flags = http2.FlagDataEndStream
	}
	b = appendFrameHeader(b, len(p), http2.FrameData, flags, streamID)
	return append(b, p...)
}

func appendSettings(b []byte, settings []http2.Setting) []byte {
	b = appendFrameHeader(b, 6*len(settings), http2.FrameSettings, 0, 0)
	for _, s := range settings {
		b = append(b, byte(s.ID>>8), byte(s.ID))
		b = appendUint32(b, s.Val)
	}
	return b
}

func appendSettingsAck(b []byte) []byte {
	return appendFrameHeader(b, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
}

func appendWindowUpdate(b []byte, streamID, incr uint32) []byte {
	b = appendFrameHeader(b, 4, http2.FrameWindowUpdate, 0, streamID)
	return appendUint32(b, incr&maxWindow)
}

func appendRSTStream(b []byte, streamID uint32, code http2.ErrCode) []byte {
	b = appendFrameHeader(b, 4, http2.FrameRSTStream, 0, streamID)
	return appendUint32(b, uint32(code))
}

func appendPing(b []byte, ack bool, data [8]byte) []byte {
	var flags http2.Flags
	if ack {
		flags = http2.FlagPingAck
	}
	b = appendFrameHeader(b, 8, http2.FramePing, flags, 0)
	return append(b, data[:]...)
}

func appendGoAway(b []byte, lastStreamID uint32, code http2.ErrCode, debug string) []byte {
	b = appendFrameHeader(b, 8+len(debug), http2.FrameGoAway, 0, 0)
	b = appendUint32(b, lastStreamID&maxStreamID)
	b = appendUint32(b, uint32(code))
	return append(b, debug...)
}

// appendHeaderBlock frames an encoded header block as HEADERS followed by as
// many CONTINUATION frames as maxFrame requires.
func appendHeaderBlock(b []byte, streamID uint32, end bool, block []byte, maxFrame int) []byte {
	t := http2.FrameHeaders
	for {
		n := min(len(block), maxFrame)
		var flags http2.Flags
		if t == http2.FrameHeaders && end {
			flags |= http2.FlagHeadersEndStream
		}
		if n == len(block) {
			flags |= http2.FlagHeadersEndHeaders // same bit as FlagContinuationEndHeaders
		}
		b = appendFrameHeader(b, n, t, flags, streamID)
		b = append(b, block[:n]...)
		block = block[n:]
		if len(block) == 0 {
			return b
		}
		t = http2.FrameContinuation
	}
}
