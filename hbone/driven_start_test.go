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

// TestServerStart: Start returns as soon as the connection runs, before
// the client has sent a byte, with goroutines and on a loop; done comes
// once, after the connection ended and its last handler returned.
func TestServerStart(t *testing.T) {
	onceOnly(t)
	for _, tc := range []struct {
		name string
		loop bool
	}{{"goroutines", false}, {"loop", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{}
			if tc.loop {
				cfg.Drive = newTestLoop(t).drive
			}
			ctxDone, release := make(chan struct{}), make(chan struct{})
			srv := NewServer(cfg, func(ctx context.Context, req *ServerRequest) {
				if _, err := req.Respond(200, nil); err != nil {
					t.Error(err)
				}
				<-ctx.Done() // the connection ended
				close(ctxDone)
				<-release
			})
			sc, cc := nettest.TCPPair(t)
			done := make(chan error, 2)
			if err := srv.Start(context.Background(), newLoopConn(sc), func(err error) { done <- err }); err != nil {
				t.Fatal(err)
			}
			client, err := NewClientConn(cc, Config{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := client.Connect(testContext(t), &Request{Authority: "10.0.0.1:80"}); err != nil {
				t.Fatal(err)
			}
			_ = client.Close()
			select {
			case <-ctxDone:
			case <-time.After(testTimeout):
				t.Fatal("the handler's context was not cancelled at the connection's end")
			}
			select {
			case err := <-done:
				t.Fatalf("done(%v) while a handler still runs", err)
			default:
			}
			close(release)
			select {
			case <-done:
			case <-time.After(testTimeout):
				t.Fatal("done not called after the last handler returned")
			}
			srv.Close() // waits for done calls: none left
			select {
			case err := <-done:
				t.Fatalf("done called twice, again with %v", err)
			default:
			}
		})
	}
}
