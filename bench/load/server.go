package load

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// ServerConfig configures a Server. The zero value is usable.
type ServerConfig struct {
	// HeaderTimeout bounds the wait for a connection's header. Default 10s.
	HeaderTimeout time.Duration
	// ReadSize is the sink's read buffer. Default 256 KiB.
	ReadSize int
	// Raw makes every connection an echo with no header (for clients that do
	// not speak the header, such as an HBONE peer's health check).
	Raw bool
	// Logf receives per-connection errors. Nil discards them.
	Logf func(format string, args ...any)
}

// Server is the echo/sink end of every load mode.
type Server struct {
	cfg ServerConfig
	a   Acceptor
}

// NewServer returns a server; Serve runs it on a listener.
func NewServer(cfg ServerConfig) *Server {
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = 10 * time.Second
	}
	if cfg.ReadSize <= 0 {
		cfg.ReadSize = 256 << 10
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	return &Server{cfg: cfg}
}

// Serve accepts connections on ln until ctx ends or ln fails, then closes ln
// and every open connection and returns once their goroutines are done. It
// returns nil when ctx ended it.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	err := s.a.Serve(ctx, ln, func(_ context.Context, c net.Conn) {
		if err := s.serveConn(c); err != nil {
			s.cfg.Logf("load: server: %v: %v", c.RemoteAddr(), err)
		}
	})
	if err != nil {
		return fmt.Errorf("load: accept: %w", err)
	}
	return nil
}

func (s *Server) serveConn(c net.Conn) error {
	if s.cfg.Raw {
		return echo(c)
	}
	var hb [HeaderLen]byte
	_ = c.SetReadDeadline(time.Now().Add(s.cfg.HeaderTimeout))
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		return fmt.Errorf("read header: %w", err)
	}
	_ = c.SetReadDeadline(time.Time{})
	h, err := ParseHeader(hb[:])
	if err != nil {
		return err
	}
	switch h.Op {
	case OpEcho:
		return echo(c)
	case OpSink:
		return s.sink(c)
	default:
		return serveRR(c, h)
	}
}

// halfCloser is every connection type the load modes use: TCP, TLS, HBONE.
type halfCloser interface{ CloseWrite() error }

func closeWrite(c net.Conn) error {
	if hc, ok := c.(halfCloser); ok {
		return hc.CloseWrite()
	}
	return nil
}

func echo(c net.Conn) error {
	if _, err := io.Copy(c, c); err != nil {
		return err
	}
	return closeWrite(c)
}

func (s *Server) sink(c net.Conn) error {
	buf := make([]byte, s.cfg.ReadSize)
	var n int64
	for {
		m, err := c.Read(buf)
		n += int64(m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	if _, err := c.Write(b[:]); err != nil {
		return err
	}
	return closeWrite(c)
}

func serveRR(c net.Conn, h Header) error {
	req := make([]byte, h.Req)
	resp := make([]byte, h.Resp)
	for {
		if _, err := io.ReadFull(c, req); err != nil {
			if errors.Is(err, io.EOF) && h.Op == OpRR {
				return closeWrite(c) // the client is done, at a request boundary
			}
			return err
		}
		if _, err := c.Write(resp); err != nil {
			return err
		}
		if h.Op == OpOnce {
			// Close first (the deferred Close), leaving TIME_WAIT here.
			return nil
		}
	}
}
