package socks5

import (
	"fmt"
	"io"
)

// ClientHandshake runs the client side for target with no authentication:
// greeting, request, and the server's reply. It returns the reply code; a
// code other than ReplySucceeded also returns an error. Tests and the lab
// use it to drive the listener as an application would.
func ClientHandshake(rw io.ReadWriter, t Target) (Reply, error) {
	req, err := AppendRequest([]byte{Version, 1, MethodNoAuth}, CmdConnect, t)
	if err != nil {
		return ReplyGeneralFailure, err
	}
	if _, err := rw.Write(req); err != nil {
		return ReplyGeneralFailure, fmt.Errorf("socks5: write request: %w", err)
	}
	var choice [2]byte
	if _, err := io.ReadFull(rw, choice[:]); err != nil {
		return ReplyGeneralFailure, fmt.Errorf("socks5: read method choice: %w", err)
	}
	if choice[0] != Version {
		return ReplyGeneralFailure, fmt.Errorf("%w %d in method choice", ErrVersion, choice[0])
	}
	if choice[1] != MethodNoAuth {
		return ReplyGeneralFailure, fmt.Errorf("%w (server chose %#x)", ErrNoAcceptableMethod, choice[1])
	}
	var hdr [4]byte
	if _, err := io.ReadFull(rw, hdr[:]); err != nil {
		return ReplyGeneralFailure, fmt.Errorf("socks5: read reply: %w", err)
	}
	if hdr[0] != Version {
		return ReplyGeneralFailure, fmt.Errorf("%w %d in reply", ErrVersion, hdr[0])
	}
	// Consume the bound address so the stream is positioned at the data.
	if _, _, err := readAddr(io.Reader(rw), hdr[3]); err != nil {
		return ReplyGeneralFailure, err
	}
	if rep := Reply(hdr[1]); rep != ReplySucceeded {
		return rep, fmt.Errorf("socks5: server replied %#x", byte(rep))
	}
	return ReplySucceeded, nil
}

// AppendRequest appends a request message (VER CMD RSV ATYP DST.ADDR
// DST.PORT) for t to b.
func AppendRequest(b []byte, cmd byte, t Target) ([]byte, error) {
	b = append(b, Version, cmd, 0)
	switch {
	case t.Addr.IsValid() && t.Addr.Addr().Is4():
		a := t.Addr.Addr().As4()
		b = append(append(b, AddrIPv4), a[:]...)
	case t.Addr.IsValid():
		a := t.Addr.Addr().As16()
		b = append(append(b, AddrIPv6), a[:]...)
	default:
		if len(t.Host) == 0 || len(t.Host) > 255 {
			return nil, fmt.Errorf("%w: domain name of %d bytes", ErrMalformed, len(t.Host))
		}
		b = append(append(b, AddrDomain, byte(len(t.Host))), t.Host...)
	}
	port := t.Port
	if t.Addr.IsValid() {
		port = t.Addr.Port()
	}
	return append(b, byte(port>>8), byte(port)), nil
}
