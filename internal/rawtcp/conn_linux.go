package rawtcp

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Errors that end a connection.
var (
	// ErrRefused is returned by Dial when the peer answers the SYN with a
	// reset.
	ErrRefused = errors.New("rawtcp: connection refused (reset in answer to the SYN)")
	// ErrReset is returned once the peer has reset an established
	// connection.
	ErrReset = errors.New("rawtcp: connection reset by peer")
)

const (
	// window is the receive window advertised (no window scaling).
	window = 0xffff
	// mss is what a SYN advertises and the most a data segment carries:
	// below any lab MTU for IPv4 and IPv6.
	mss = 1200
	// synRetry and dataRetry are the retransmission intervals. No backoff:
	// the lab's links lose nothing but what a busy peer drops.
	synRetry  = time.Second
	dataRetry = 300 * time.Millisecond
)

// Config says where a Conn sends from and to.
type Config struct {
	// Interface names the interface (in the namespace the socket is made
	// in, see Control) the packets go out on and the answers come in on.
	Interface string
	// DstMAC is the next hop's link-layer address: the target's own on a
	// shared L2, or a router's.
	DstMAC net.HardwareAddr
	// Src is our address and port: an address of Interface's namespace
	// and a port no socket there uses (the kernel answers the peer's
	// packets too; see the package doc). Dst is the destination as written
	// into the packets: any address of Src's IP version.
	Src, Dst netip.AddrPort
	// Control, when set, runs the socket's creation (inside a network
	// namespace, like netnslab.NS.Do); the socket stays there for its
	// life, whichever goroutine uses it.
	Control func(fn func() error) error
}

// Conn is one TCP connection driven from user space. It is not safe for
// concurrent use. Its methods wait until their context's deadline: a
// context cancelled without one is noticed only at the next packet or
// retransmission, so callers give every context a deadline.
type Conn struct {
	cfg  Config
	f    *os.File
	rc   syscall.RawConn
	peer unix.SockaddrLinklayer

	iss, sndNxt, sndUna, rcvNxt uint32
	unacked                     []byte // sent, not yet acknowledged: from sndUna
	lastSend                    time.Time

	buf         []byte // received in order, not yet returned by Read
	eof, reset  bool
	established bool

	rbuf, oob []byte
	// Dropped counts packets of this connection's flow the parser refused
	// (malformed, bad checksum): a reason to distrust the peer's stack or
	// the lab, reported by tests that fail.
	Dropped int
}

// Dial opens the socket and completes a TCP handshake with cfg.Dst,
// retransmitting the SYN every second until ctx ends. A reset in answer is
// ErrRefused.
func Dial(ctx context.Context, cfg Config) (*Conn, error) {
	if cfg.Src.Addr().Is4() != cfg.Dst.Addr().Is4() || !cfg.Src.IsValid() || !cfg.Dst.IsValid() {
		return nil, fmt.Errorf("rawtcp: %v and %v are not of one IP version", cfg.Src, cfg.Dst)
	}
	if len(cfg.DstMAC) != 6 {
		return nil, fmt.Errorf("rawtcp: next-hop MAC %v is not an Ethernet address", cfg.DstMAC)
	}
	c := &Conn{cfg: cfg, rbuf: make([]byte, 1<<16+512), oob: make([]byte, unix.CmsgSpace(int(binaryAuxSize)))}
	open := c.open
	if cfg.Control != nil {
		open = func() error { return cfg.Control(c.open) }
	}
	if err := open(); err != nil {
		return nil, err
	}
	var isn [4]byte
	_, _ = rand.Read(isn[:]) // crypto/rand.Read never fails on Linux
	c.iss = binary.BigEndian.Uint32(isn[:])
	c.sndNxt, c.sndUna = c.iss+1, c.iss
	if err := c.handshake(ctx); err != nil {
		c.f.Close()
		return nil, err
	}
	return c, nil
}

// binaryAuxSize is the size of struct tpacket_auxdata.
const binaryAuxSize = 20

// open makes the AF_PACKET socket, bound to cfg.Interface for the
// destination's IP version, with the kernel's per-packet auxiliary data on
// (to tell an offloaded checksum from a wrong one).
func (c *Conn) open() error {
	ifi, err := net.InterfaceByName(c.cfg.Interface)
	if err != nil {
		return fmt.Errorf("rawtcp: %w", err)
	}
	proto := uint16(unix.ETH_P_IPV6)
	if c.cfg.Dst.Addr().Is4() {
		proto = unix.ETH_P_IP
	}
	// Protocol 0 receives nothing until bind names one: no packet of
	// another interface slips in between.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("rawtcp: AF_PACKET socket: %w", err)
	}
	c.peer = unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: ifi.Index, Halen: 6}
	copy(c.peer.Addr[:], c.cfg.DstMAC)
	for _, o := range []struct {
		name      string
		opt, val  int
		mandatory bool
	}{
		{"PACKET_AUXDATA", unix.PACKET_AUXDATA, 1, true},
		{"PACKET_IGNORE_OUTGOING", unix.PACKET_IGNORE_OUTGOING, 1, false}, // Linux 4.20; Pkttype filters too
	} {
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, o.opt, o.val); err != nil && o.mandatory {
			unix.Close(fd)
			return fmt.Errorf("rawtcp: %s: %w", o.name, err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("rawtcp: bind to %s: %w", c.cfg.Interface, err)
	}
	c.f = os.NewFile(uintptr(fd), "rawtcp:"+c.cfg.Interface)
	if c.rc, err = c.f.SyscallConn(); err != nil {
		c.f.Close()
		return err
	}
	return nil
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// send writes one segment of this connection with the given flags, seq and
// payload (ack is always rcvNxt once established).
func (c *Conn) send(flags uint8, seq uint32, payload []byte) error {
	s := Segment{Src: c.cfg.Src, Dst: c.cfg.Dst, Seq: seq, Flags: flags, Window: window, Payload: payload}
	if flags&FlagACK != 0 {
		s.Ack = c.rcvNxt
	}
	if flags&FlagSYN != 0 {
		s.MSS = mss
	}
	pkt, err := s.Marshal()
	if err != nil {
		return err
	}
	var serr error
	err = c.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), pkt, 0, &c.peer)
		return serr != unix.EAGAIN
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("rawtcp: send %s: %w", s.String(), err)
	}
	c.lastSend = time.Now()
	return nil
}

// next returns the next segment of this connection's flow that the parser
// accepts, or os.ErrDeadlineExceeded at deadline.
func (c *Conn) next(deadline time.Time) (Segment, error) {
	if err := c.f.SetReadDeadline(deadline); err != nil {
		return Segment{}, err
	}
	for {
		var (
			n, oobn, flags int
			from           unix.Sockaddr
			rerr           error
		)
		err := c.rc.Read(func(fd uintptr) bool {
			n, oobn, flags, from, rerr = unix.Recvmsg(int(fd), c.rbuf, c.oob, 0)
			return rerr != unix.EAGAIN
		})
		if err == nil {
			err = rerr
		}
		if err != nil {
			return Segment{}, err
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Pkttype != unix.PACKET_HOST || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			continue // not addressed to us, or cut short
		}
		verify, err := checksumReady(c.oob[:oobn])
		if err != nil {
			return Segment{}, err
		}
		s, err := Parse(c.rbuf[:n], verify)
		if errors.Is(err, ErrNotTCP) {
			continue
		}
		if err != nil {
			// A refused packet might still be of our flow; count those
			// whose addresses say so (a malformed header may not even
			// hold them: such packets are just skipped).
			if looksOurs(c.rbuf[:n], c.cfg) {
				c.Dropped++
			}
			continue
		}
		if s.Src != c.cfg.Dst || s.Dst != c.cfg.Src {
			continue
		}
		return s, nil
	}
}

// looksOurs reports whether a packet Parse refused carries our flow's
// addresses and ports where a well-formed one would.
func looksOurs(pkt []byte, cfg Config) bool {
	var src, dst netip.Addr
	var tcp []byte
	switch {
	case len(pkt) >= ipv4HdrLen && pkt[0]>>4 == 4:
		ihl := int(pkt[0]&0x0f) * 4
		if ihl < ipv4HdrLen || len(pkt) < ihl+4 {
			return false
		}
		src, dst, tcp = netip.AddrFrom4([4]byte(pkt[12:16])), netip.AddrFrom4([4]byte(pkt[16:20])), pkt[ihl:]
	case len(pkt) >= ipv6HdrLen+4 && pkt[0]>>4 == 6:
		src, dst, tcp = netip.AddrFrom16([16]byte(pkt[8:24])), netip.AddrFrom16([16]byte(pkt[24:40])), pkt[ipv6HdrLen:]
	default:
		return false
	}
	return netip.AddrPortFrom(src, binary.BigEndian.Uint16(tcp)) == cfg.Dst &&
		netip.AddrPortFrom(dst, binary.BigEndian.Uint16(tcp[2:])) == cfg.Src
}

// checksumReady reads the packet's tpacket_auxdata: false when the kernel
// reports the TCP checksum not filled in yet (TP_STATUS_CSUMNOTREADY: the
// sender offloaded it and the packet never left the host), true otherwise.
func checksumReady(oob []byte) (bool, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return false, fmt.Errorf("rawtcp: control message: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_PACKET && m.Header.Type == unix.PACKET_AUXDATA && len(m.Data) >= 4 {
			return binary.NativeEndian.Uint32(m.Data)&unix.TP_STATUS_CSUMNOTREADY == 0, nil
		}
	}
	return false, errors.New("rawtcp: no PACKET_AUXDATA with the packet")
}

// wait returns when the next retransmission is due or ctx's deadline
// comes, whichever is first.
func wait(ctx context.Context, retransmitAt time.Time) time.Time {
	if d, ok := ctx.Deadline(); ok && d.Before(retransmitAt) {
		return d
	}
	return retransmitAt
}

func (c *Conn) handshake(ctx context.Context) error {
	if err := c.send(FlagSYN, c.iss, nil); err != nil {
		return err
	}
	for {
		s, err := c.next(wait(ctx, c.lastSend.Add(synRetry)))
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("rawtcp: no answer from %s: %w", c.cfg.Dst, err)
			}
			if err := c.send(FlagSYN, c.iss, nil); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		switch {
		case s.Has(FlagRST):
			// RFC 9293 3.10.7.3: in SYN-SENT a reset counts only if it
			// acknowledges our SYN.
			if s.Has(FlagACK) && s.Ack == c.sndNxt {
				return ErrRefused
			}
		case s.Has(FlagSYN|FlagACK) && s.Ack == c.sndNxt:
			c.rcvNxt, c.sndUna, c.established = s.Seq+1, s.Ack, true
			return c.send(FlagACK, c.sndNxt, nil)
		}
	}
}

// seqLT and seqLE compare sequence numbers modulo 2^32.
func seqLT(a, b uint32) bool { return int32(a-b) < 0 }
func seqLE(a, b uint32) bool { return int32(a-b) <= 0 }

// handle applies one segment of an established connection: an in-window
// reset ends it; an acknowledgement releases what it covers; data and FIN
// in order are taken and acknowledged, anything else is acknowledged again
// (duplicates, and out-of-order data the peer will retransmit).
func (c *Conn) handle(s Segment) error {
	if s.Has(FlagRST) {
		if seqLE(c.rcvNxt, s.Seq) && seqLT(s.Seq, c.rcvNxt+window) {
			c.reset = true
		}
		return nil
	}
	if s.Has(FlagSYN) {
		// Our ACK of the SYN-ACK was lost: acknowledge it again.
		return c.send(FlagACK, c.sndNxt, nil)
	}
	if s.Has(FlagACK) && seqLT(c.sndUna, s.Ack) && seqLE(s.Ack, c.sndNxt) {
		c.unacked = c.unacked[s.Ack-c.sndUna:]
		c.sndUna = s.Ack
	}
	fin := s.Has(FlagFIN)
	if len(s.Payload) == 0 && !fin {
		return nil
	}
	data := s.Payload
	if seqLT(s.Seq, c.rcvNxt) {
		// A retransmission overlapping what we have: keep the new part.
		skip := c.rcvNxt - s.Seq
		if uint32(len(data)) < skip {
			return c.send(FlagACK, c.sndNxt, nil)
		}
		data, s.Seq = data[skip:], c.rcvNxt
	}
	if s.Seq != c.rcvNxt || c.eof {
		return c.send(FlagACK, c.sndNxt, nil)
	}
	c.buf = append(c.buf, data...)
	c.rcvNxt += uint32(len(data))
	if fin {
		c.rcvNxt++
		c.eof = true
	}
	return c.send(FlagACK, c.sndNxt, nil)
}

// retransmit sends again what the peer has not acknowledged, if anything.
func (c *Conn) retransmit() error {
	for off := 0; off < len(c.unacked); off += mss {
		seg := c.unacked[off:min(off+mss, len(c.unacked))]
		if err := c.send(FlagACK|FlagPSH, c.sndUna+uint32(off), seg); err != nil {
			return err
		}
	}
	return nil
}

// step waits for one segment (or the next retransmission) and applies it.
func (c *Conn) step(ctx context.Context) error {
	at := time.Now().Add(time.Hour)
	if len(c.unacked) > 0 {
		at = c.lastSend.Add(dataRetry)
	}
	s, err := c.next(wait(ctx, at))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if err := ctx.Err(); err != nil {
			return err
		}
		return c.retransmit()
	}
	if err != nil {
		return err
	}
	return c.handle(s)
}

// Write sends p and waits until the peer has acknowledged all of it,
// retransmitting meanwhile. Data that arrives in the meantime is kept for
// Read.
func (c *Conn) Write(ctx context.Context, p []byte) error {
	if c.reset {
		return ErrReset
	}
	start := len(c.unacked)
	c.unacked = append(c.unacked, p...)
	for off := start; off < len(c.unacked); off += mss {
		seg := c.unacked[off:min(off+mss, len(c.unacked))]
		if err := c.send(FlagACK|FlagPSH, c.sndNxt, seg); err != nil {
			return err
		}
		c.sndNxt += uint32(len(seg))
	}
	for len(c.unacked) > 0 {
		if c.reset {
			return ErrReset
		}
		if err := c.step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Read returns the data received so far that Read has not returned yet,
// waiting for some if there is none. Once that is drained it returns io.EOF
// after the peer's FIN, ErrReset after its reset, or ctx's error.
func (c *Conn) Read(ctx context.Context) ([]byte, error) {
	for {
		if len(c.buf) > 0 {
			b := c.buf
			c.buf = nil
			return b, nil
		}
		switch {
		case c.reset:
			return nil, ErrReset
		case c.eof:
			return nil, io.EOF
		}
		if err := c.step(ctx); err != nil {
			return nil, err
		}
	}
}

// ReadAll reads until the peer's FIN (a nil error), its reset (ErrReset)
// or the end of ctx (ctx's error), and returns all the data received.
func (c *Conn) ReadAll(ctx context.Context) ([]byte, error) {
	var all []byte
	for {
		b, err := c.Read(ctx)
		all = append(all, b...)
		if err == io.EOF {
			return all, nil
		}
		if err != nil {
			return all, err
		}
	}
}

// Close resets the connection (unless the peer already did) and closes the
// socket.
func (c *Conn) Close() error {
	var err error
	if c.established && !c.reset {
		err = c.send(FlagRST|FlagACK, c.sndNxt, nil)
		c.reset = true
	}
	return errors.Join(err, c.f.Close())
}
