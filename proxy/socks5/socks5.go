package socks5

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
)

// Version is the protocol version byte of every SOCKS5 message.
const Version = 5

// Authentication methods (RFC 1928 section 3).
const (
	MethodNoAuth       = 0x00
	MethodNoAcceptable = 0xFF
)

// Commands (RFC 1928 section 4).
const (
	CmdConnect      = 0x01
	CmdBind         = 0x02
	CmdUDPAssociate = 0x03
)

// Address types (RFC 1928 section 5).
const (
	AddrIPv4   = 0x01
	AddrDomain = 0x03
	AddrIPv6   = 0x04
)

// Reply is the REP field of a server reply (RFC 1928 section 6).
type Reply byte

// Reply codes.
const (
	ReplySucceeded               Reply = 0x00
	ReplyGeneralFailure          Reply = 0x01
	ReplyNotAllowed              Reply = 0x02
	ReplyNetworkUnreachable      Reply = 0x03
	ReplyHostUnreachable         Reply = 0x04
	ReplyConnectionRefused       Reply = 0x05
	ReplyTTLExpired              Reply = 0x06
	ReplyCommandNotSupported     Reply = 0x07
	ReplyAddressTypeNotSupported Reply = 0x08
)

// Errors returned by Handshake; each is wrapped with the offending value.
var (
	// ErrVersion means the client spoke another protocol or SOCKS version.
	ErrVersion = errors.New("socks5: unsupported version")
	// ErrNoAcceptableMethod means the client does not offer "no
	// authentication"; the server answered 0xFF.
	ErrNoAcceptableMethod = errors.New("socks5: no acceptable authentication method")
	// ErrCommand means a command other than CONNECT; the server answered
	// "command not supported".
	ErrCommand = errors.New("socks5: command not supported")
	// ErrAddressType means an unknown address type; the server answered
	// "address type not supported".
	ErrAddressType = errors.New("socks5: address type not supported")
	// ErrMalformed means a message that breaks the format (a reserved byte
	// set, an empty method list or domain, port 0).
	ErrMalformed = errors.New("socks5: malformed message")
)

// Target is where a client asked to connect: an IP address and port, or a
// domain name and port.
type Target struct {
	// Addr is set for IPv4 and IPv6 targets, and for domain names that are
	// IP literals.
	Addr netip.AddrPort
	// Host is set for domain-name targets.
	Host string
	// Port is the destination port (also in Addr when Addr is set).
	Port uint16
}

// IsDomain reports whether the target is a name that must be resolved.
func (t Target) IsDomain() bool { return !t.Addr.IsValid() }

// String returns "ip:port" or "host:port".
func (t Target) String() string {
	if t.Addr.IsValid() {
		return t.Addr.String()
	}
	return t.Host + ":" + strconv.Itoa(int(t.Port))
}

// Handshake runs the server side of the handshake on rw: it reads the
// client's greeting, answers with "no authentication" (or 0xFF when the
// client does not offer it), and reads the request. A request the server
// cannot serve (another command, an unknown address type) is answered with
// the matching failure reply before the error is returned. On success
// nothing has been replied yet: the caller sends [WriteReply] itself,
// so it decides when (ztunnel replies success before it connects upstream).
func Handshake(rw io.ReadWriter) (Target, error) {
	if err := negotiate(rw); err != nil {
		return Target{}, err
	}
	t, rep, err := ReadRequest(rw)
	if err != nil {
		if rep != ReplySucceeded {
			if werr := WriteReply(rw, rep, netip.AddrPort{}); werr != nil {
				return Target{}, errors.Join(err, werr)
			}
		}
		return Target{}, err
	}
	return t, nil
}

// negotiate reads the method-selection message and answers it.
func negotiate(rw io.ReadWriter) error {
	var buf [255]byte
	if _, err := io.ReadFull(rw, buf[:2]); err != nil {
		return fmt.Errorf("socks5: read greeting: %w", err)
	}
	if buf[0] != Version {
		return fmt.Errorf("%w %d in greeting", ErrVersion, buf[0])
	}
	n := int(buf[1])
	if n == 0 {
		return fmt.Errorf("%w: greeting offers no method", ErrMalformed)
	}
	methods := buf[:n]
	if _, err := io.ReadFull(rw, methods); err != nil {
		return fmt.Errorf("socks5: read methods: %w", err)
	}
	choice := byte(MethodNoAcceptable)
	for _, m := range methods {
		if m == MethodNoAuth {
			choice = MethodNoAuth
			break
		}
	}
	if _, err := rw.Write([]byte{Version, choice}); err != nil {
		return fmt.Errorf("socks5: write method choice: %w", err)
	}
	if choice == MethodNoAcceptable {
		return fmt.Errorf("%w (offered % x)", ErrNoAcceptableMethod, methods)
	}
	return nil
}

// ReadRequest reads one request (VER CMD RSV ATYP DST.ADDR DST.PORT). On an
// error, the returned Reply is the failure to answer with, or
// ReplySucceeded when the client should get no reply (the connection is
// broken or the message unreadable).
func ReadRequest(r io.Reader) (Target, Reply, error) {
	var buf [4]byte
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return Target{}, ReplySucceeded, fmt.Errorf("socks5: read request: %w", err)
	}
	if buf[0] != Version {
		return Target{}, ReplyGeneralFailure, fmt.Errorf("%w %d in request", ErrVersion, buf[0])
	}
	if buf[2] != 0 {
		return Target{}, ReplyGeneralFailure, fmt.Errorf("%w: reserved byte %#x in request", ErrMalformed, buf[2])
	}
	// The address is parsed even for a command we refuse, so the failure
	// is reported for the right reason when both are wrong.
	cmd := buf[1]
	t, rep, err := readAddr(r, buf[3])
	if err != nil {
		return Target{}, rep, err
	}
	if cmd != CmdConnect {
		return Target{}, ReplyCommandNotSupported, fmt.Errorf("%w: %#x", ErrCommand, cmd)
	}
	if t.Port == 0 {
		return Target{}, ReplyGeneralFailure, fmt.Errorf("%w: port 0", ErrMalformed)
	}
	return t, ReplySucceeded, nil
}

func readAddr(r io.Reader, atyp byte) (Target, Reply, error) {
	var buf [1 + 255 + 2]byte
	var t Target
	switch atyp {
	case AddrIPv4:
		if _, err := io.ReadFull(r, buf[:4+2]); err != nil {
			return t, ReplySucceeded, fmt.Errorf("socks5: read IPv4 address: %w", err)
		}
		t.Port = uint16(buf[4])<<8 | uint16(buf[5])
		t.Addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[:4])), t.Port)
	case AddrIPv6:
		if _, err := io.ReadFull(r, buf[:16+2]); err != nil {
			return t, ReplySucceeded, fmt.Errorf("socks5: read IPv6 address: %w", err)
		}
		t.Port = uint16(buf[16])<<8 | uint16(buf[17])
		// A v4-mapped address is the IPv4 destination it names.
		t.Addr = netip.AddrPortFrom(netip.AddrFrom16([16]byte(buf[:16])).Unmap(), t.Port)
	case AddrDomain:
		if _, err := io.ReadFull(r, buf[:1]); err != nil {
			return t, ReplySucceeded, fmt.Errorf("socks5: read domain length: %w", err)
		}
		n := int(buf[0])
		if _, err := io.ReadFull(r, buf[:n+2]); err != nil {
			return t, ReplySucceeded, fmt.Errorf("socks5: read domain: %w", err)
		}
		t.Port = uint16(buf[n])<<8 | uint16(buf[n+1])
		host := string(buf[:n])
		if err := checkHost(host); err != nil {
			return Target{}, ReplyGeneralFailure, err
		}
		// Some clients send IP literals as names; they need no resolving.
		if ip, err := netip.ParseAddr(host); err == nil && ip.Zone() == "" {
			t.Addr = netip.AddrPortFrom(ip.Unmap(), t.Port)
		} else {
			t.Host = host
		}
	default:
		return t, ReplyAddressTypeNotSupported, fmt.Errorf("%w: %#x", ErrAddressType, atyp)
	}
	return t, ReplySucceeded, nil
}

// checkHost accepts printable ASCII names without spaces: what a resolver
// can look up. Anything else is refused here rather than passed on.
func checkHost(h string) error {
	if h == "" {
		return fmt.Errorf("%w: empty domain name", ErrMalformed)
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("%w: byte %#x in domain name", ErrMalformed, c)
		}
	}
	return nil
}

// WriteReply sends a reply with the bound address bnd (the zero AddrPort
// sends 0.0.0.0:0, which clients of a CONNECT ignore).
func WriteReply(w io.Writer, rep Reply, bnd netip.AddrPort) error {
	b := make([]byte, 0, 4+16+2)
	b = append(b, Version, byte(rep), 0)
	ip := bnd.Addr().Unmap()
	switch {
	case ip.Is6():
		b = append(b, AddrIPv6)
		a := ip.As16()
		b = append(b, a[:]...)
	case ip.Is4():
		b = append(b, AddrIPv4)
		a := ip.As4()
		b = append(b, a[:]...)
	default:
		b = append(b, AddrIPv4, 0, 0, 0, 0)
	}
	b = append(b, byte(bnd.Port()>>8), byte(bnd.Port()))
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("socks5: write reply: %w", err)
	}
	return nil
}
