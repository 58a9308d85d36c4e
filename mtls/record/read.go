package record

import (
	"errors"
	"fmt"
	"io"
	"net"
)

const (
	// maxHandshakeMsg caps a post-handshake message (session tickets are a
	// few hundred bytes in practice), so a peer cannot make us buffer much.
	maxHandshakeMsg = 32 << 10
	// maxIdleRecords caps consecutive records that carry no data (empty
	// records, ignored tickets, key updates), so a peer cannot keep a Read
	// busy without progress.
	maxIdleRecords = 64

	hsNewSessionTicket = 4
	hsKeyUpdate        = 24
)

// Read reads application data. After the peer's close_notify it returns
// io.EOF; if the stream ends inside a record, io.ErrUnexpectedEOF; if the
// peer breaks the protocol, a *ProtocolError; if it sends a fatal alert,
// an AlertError. A record decrypts straight into p when p has room for it.
func (c *Conn) Read(p []byte) (int, error) {
	own, err := c.ownRecords()
	if err != nil {
		return 0, err
	}
	if !own {
		return c.tc.Read(p)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.fdMode.Load() {
		return 0, ErrFDMode
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, err := c.readLocked(p)
	c.releaseIfEmptyLocked()
	if n > 0 {
		return n, nil
	}
	return 0, err
}

// readLocked fills p from buffered plaintext and complete records, reading
// the socket only while it has nothing to return.
func (c *Conn) readLocked(p []byte) (int, error) {
	n := 0
	for {
		if len(c.plain) > 0 {
			k := copy(p[n:], c.plain)
			c.plain = c.plain[k:]
			n += k
			if n == len(p) {
				return n, nil
			}
		}
		if c.rerr != nil {
			return n, c.rerr
		}
		avail := c.w - c.r
		length := -1
		if avail >= headerLen {
			hdr := (*c.rb)[c.r : c.r+headerLen]
			if hdr[0] != typeApplicationData {
				return n, c.failLocked(alertUnexpectedMessage, fmt.Sprintf("record of type %d after the handshake", hdr[0]))
			}
			length = int(hdr[3])<<8 | int(hdr[4])
			if length > maxCiphertext {
				return n, c.failLocked(alertRecordOverflow, fmt.Sprintf("record of %d bytes", length))
			}
		}
		if length < 0 || avail < headerLen+length {
			if n > 0 {
				return n, nil
			}
			need := maxRecord
			if length >= 0 {
				need = headerLen + length
			}
			if err := c.fillLocked(need); err != nil {
				return 0, c.readErrorLocked(err)
			}
			continue
		}
		k, stop, err := c.recordLocked(p[n:], n > 0, length)
		n += k
		if err != nil || stop {
			return n, err
		}
	}
}

// recordLocked processes the complete record at c.r. When p has room for
// its plaintext it decrypts into p and returns the content length; else,
// unless more (then stop is true and the record is left for the next
// Read), it decrypts in place and leaves the content in c.plain.
func (c *Conn) recordLocked(p []byte, more bool, length int) (n int, stop bool, err error) {
	buf := *c.rb
	hdr := buf[c.r : c.r+headerLen]
	ct := buf[c.r+headerLen : c.r+headerLen+length]
	if length < tagLen {
		// No AEAD tag fits: the record cannot be authentic (RFC 8446
		// section 5.2: decryption fails, so bad_record_mac).
		return 0, false, c.failLocked(alertBadRecordMAC, fmt.Sprintf("record of %d bytes is too short for a tag", length))
	}
	direct := len(p) >= length-tagLen
	if !direct && more {
		return 0, true, nil
	}
	nonce, err := c.in.nextNonce()
	if err != nil {
		return 0, false, c.failLocked(alertInternalError, err.Error())
	}
	var pt []byte
	if direct {
		pt, err = c.in.aead.Open(p[:0:len(p)], nonce, ct, hdr)
	} else {
		pt, err = c.in.aead.Open(ct[:0:len(ct)], nonce, ct, hdr)
	}
	c.r += headerLen + length
	if err != nil {
		return 0, false, c.failLocked(alertBadRecordMAC, "record failed authentication")
	}
	if len(pt) > maxPlaintext+1 {
		// RFC 8446 section 5.4: TLSInnerPlaintext (content, type and
		// padding) is at most 2^14 + 1 bytes, padding included.
		return 0, false, c.failLocked(alertRecordOverflow, fmt.Sprintf("inner plaintext of %d bytes", len(pt)))
	}
	// Strip the padding: the content type is the last non-zero byte.
	i := len(pt) - 1
	for i >= 0 && pt[i] == 0 {
		i--
	}
	if i < 0 {
		return 0, false, c.failLocked(alertUnexpectedMessage, "record without a content type")
	}
	typ, content := pt[i], pt[:i]
	if len(c.hsMsg) > 0 && typ != typeHandshake {
		return 0, false, c.failLocked(alertUnexpectedMessage, "record interleaved with a split handshake message")
	}
	switch typ {
	case typeApplicationData:
		if len(content) == 0 {
			return 0, false, c.idleLocked()
		}
		c.idle = 0
		if direct {
			return len(content), false, nil
		}
		c.plain = content
		return 0, false, nil
	case typeAlert:
		if len(content) != 2 {
			return 0, false, c.failLocked(alertDecodeError, fmt.Sprintf("alert of %d bytes", len(content)))
		}
		switch a := alert(content[1]); a {
		case alertCloseNotify:
			c.rerr = io.EOF
			return 0, true, nil
		case alertUserCanceled:
			// A warning the peer follows with close_notify.
			return 0, false, c.idleLocked()
		default:
			c.rerr = AlertError(a)
			return 0, true, nil
		}
	case typeHandshake:
		if len(content) == 0 {
			return 0, false, c.failLocked(alertUnexpectedMessage, "empty handshake record")
		}
		if err := c.postHandshakeLocked(content); err != nil {
			return 0, false, err
		}
		return 0, false, c.idleLocked()
	default:
		return 0, false, c.failLocked(alertUnexpectedMessage, fmt.Sprintf("record of content type %d", typ))
	}
}

// idleLocked counts a record that carried no data.
func (c *Conn) idleLocked() error {
	c.idle++
	if c.idle > maxIdleRecords {
		return c.failLocked(alertUnexpectedMessage, "too many records without data")
	}
	return nil
}

// postHandshakeLocked handles the handshake messages of one record:
// NewSessionTicket is ignored (we never resume), KeyUpdate moves the read
// keys on and, if requested, asks the writer for our own KeyUpdate.
func (c *Conn) postHandshakeLocked(content []byte) error {
	msgs := content
	if len(c.hsMsg) > 0 {
		c.hsMsg = append(c.hsMsg, content...)
		msgs = c.hsMsg
	}
	for len(msgs) >= 4 {
		mlen := int(msgs[1])<<16 | int(msgs[2])<<8 | int(msgs[3])
		if mlen > maxHandshakeMsg {
			return c.failLocked(alertUnexpectedMessage, fmt.Sprintf("handshake message of %d bytes", mlen))
		}
		if len(msgs) < 4+mlen {
			break
		}
		typ, body := msgs[0], msgs[4:4+mlen]
		msgs = msgs[4+mlen:]
		switch typ {
		case hsNewSessionTicket:
			if !c.isClient {
				// RFC 8446 section 4.6.1: only servers send tickets.
				return c.failLocked(alertUnexpectedMessage, "NewSessionTicket from a client")
			}
		case hsKeyUpdate:
			if mlen != 1 {
				return c.failLocked(alertDecodeError, fmt.Sprintf("KeyUpdate of %d bytes", mlen))
			}
			if len(msgs) != 0 {
				// RFC 8446 section 5.1: a key change ends its record.
				return c.failLocked(alertUnexpectedMessage, "KeyUpdate not at the end of its record")
			}
			if body[0] > 1 {
				return c.failLocked(alertIllegalParameter, fmt.Sprintf("KeyUpdate request_update %d", body[0]))
			}
			if err := c.in.update(); err != nil {
				return c.failLocked(alertInternalError, err.Error())
			}
			if body[0] == 1 {
				c.pendingKeyUpdate.Store(true)
			}
		default:
			return c.failLocked(alertUnexpectedMessage, fmt.Sprintf("handshake message of type %d after the handshake", typ))
		}
	}
	if len(msgs) == 0 {
		c.hsMsg = nil
		return nil
	}
	c.hsMsg = append(c.hsMsg[:0], msgs...)
	return nil
}

// failLocked fails the read side for good with a protocol error and owes
// the peer alert a.
func (c *Conn) failLocked(a alert, reason string) error {
	err := &ProtocolError{Alert: uint8(a), Reason: reason}
	c.rerr = err
	c.pendingAlert.CompareAndSwap(0, uint32(a)+1)
	c.plain, c.hsMsg = nil, nil
	return err
}

// readErrorLocked turns a socket read error into the Read's error: a
// timeout (or, in fd mode, an empty socket) can be retried, anything else
// is final.
func (c *Conn) readErrorLocked(err error) error {
	if err == ErrWouldBlock {
		return err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	if err == io.EOF && c.r < c.w {
		err = io.ErrUnexpectedEOF
	}
	c.rerr = err
	return err
}
