package hbone

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/ztunnel-go/ztunnel/internal/nettest"
)

// countedDriven counts a loop's calls of a connection's Driven.
type countedDriven struct {
	Driven
	readables, ended atomic.Int32
}

func (d *countedDriven) Readable() (bool, error) {
	d.readables.Add(1)
	return d.Driven.Readable()
}

func (d *countedDriven) Ended(err error) {
	d.ended.Add(1)
	d.Driven.Ended(err)
}

// TestLoopCloseBeforeStart: a close asked of a loop-driven server
// connection after the loop's handle exists and before it started (here a
// CRL-style sweep, Server.CloseConns, while Admit runs) is honoured once
// the loop has the connection, exactly once, without a read turn: the
// client gets SETTINGS and GOAWAY, then the end of the stream, and
// ServeConn returns the sweep's cause.
func TestLoopCloseBeforeStart(t *testing.T) {
	onceOnly(t)
	loop := newTestLoop(t)
	var counted *countedDriven
	cause := errors.New("revoked while admitted")
	var srv *Server
	cfg := Config{
		Drive: func(nc net.Conn, d Driven) (Owner, bool) {
			counted = &countedDriven{Driven: d}
			return loop.drive(nc, counted)
		},
		Admit: func(net.Conn) error {
			if n := srv.CloseConns(func(net.Conn) bool { return true }, cause); n != 1 {
				t.Errorf("CloseConns closed %d connections, want 1", n)
			}
			return nil
		},
	}
	srv = NewServer(cfg, func(context.Context, *ServerRequest) { t.Error("a handler ran") })
	sc, cc := nettest.TCPPair(t)
	// The client's preface waits in the socket: no read turn may take it.
	if _, err := cc.Write(append(append([]byte(nil), http2.ClientPreface...), appendSettings(nil, nil)...)); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeConn(context.Background(), newLoopConn(sc)) }()
	_ = cc.SetDeadline(time.Now().Add(testTimeout))
	got, err := io.ReadAll(cc)
	if err != nil {
		t.Fatalf("client read %v, want EOF", err)
	}
	fr := http2.NewFramer(nil, bytes.NewReader(got))
	var kinds []http2.FrameType
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		kinds = append(kinds, f.Header().Type)
	}
	if len(kinds) == 0 || kinds[0] != http2.FrameSettings || kinds[len(kinds)-1] != http2.FrameGoAway {
		t.Fatalf("client got frames %v, want SETTINGS first and GOAWAY last", kinds)
	}
	cc.Close()
	select {
	case err := <-served:
		if !errors.Is(err, cause) {
			t.Fatalf("ServeConn = %v, want %v", err, cause)
		}
	case <-time.After(testTimeout):
		t.Fatal("ServeConn did not return")
	}
	if r, e := counted.readables.Load(), counted.ended.Load(); r != 0 || e != 1 {
		t.Fatalf("%d read turns and %d Ended calls, want 0 and 1", r, e)
	}
}
