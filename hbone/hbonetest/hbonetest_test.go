package hbonetest

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/hbone"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestEchoOverTLS(t *testing.T) {
	serverTLS, clientTLS := SelfSignedTLS(t)
	srv := Start(t, hbone.Config{}, Echo, serverTLS)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := hbone.NewPool(hbone.PoolConfig{})
	defer p.Close()
	dial := func(ctx context.Context) (net.Conn, error) { return srv.Dial(ctx, clientTLS) }
	s, err := p.Connect(ctx, "k", dial, &hbone.Request{Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := io.WriteString(s, "hello"); err != nil {
		t.Fatal(err)
	}
	_ = s.CloseWrite()
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "hello" {
		t.Fatalf("echo %q, %v", got, err)
	}
	if errs := srv.Errors(); len(errs) > 0 {
		t.Fatalf("server errors: %v", errs)
	}
}

func TestStatus(t *testing.T) {
	srv := Start(t, hbone.Config{}, Status(http.StatusUnauthorized), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := srv.Dial(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := hbone.NewClientConn(nc, hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, err = cc.Connect(ctx, &hbone.Request{Authority: "10.0.0.1:80"})
	var se *hbone.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
		t.Fatalf("Connect: %v, want 401", err)
	}
}
