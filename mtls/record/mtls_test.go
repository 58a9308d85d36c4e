package record_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/record"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// TestHBONEConfigs runs our record layer on both ends with the configs
// HBONE uses (the server's is picked per hello by GetConfigForClient) and
// checks that it, not crypto/tls, protects the data.
func TestHBONEConfigs(t *testing.T) {
	ca := tlstest.NewCA(t, "")
	srvID := identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "server"}
	cliID := identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "client"}
	srvCert, cliCert := tlstest.Cert(t, ca, srvID), tlstest.Cert(t, ca, cliID)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		peer string
		data []byte
		err  error
	}
	res := make(chan result, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			res <- result{err: err}
			return
		}
		c := record.Server(raw, mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return srvCert, nil }))
		defer c.Close()
		if err := c.HandshakeContext(context.Background()); err != nil {
			res <- result{err: err}
			return
		}
		if !record.OwnsRecords(c) {
			res <- result{err: errors.New("server fell back to crypto/tls's records")}
			return
		}
		id, err := mtls.PeerIdentity(c.ConnectionState())
		if err != nil {
			res <- result{err: err}
			return
		}
		data, err := io.ReadAll(c)
		if err == nil {
			_, err = c.Write(data)
		}
		res <- result{peer: id.String(), data: data, err: err}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := record.Client(raw, mtls.ClientConfig(cliCert, []string{srvID.String()}))
	defer c.Close()
	if err := c.HandshakeContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !record.OwnsRecords(c) {
		t.Fatal("client fell back to crypto/tls's records")
	}
	msg := bytes.Repeat([]byte("hbone "), 50000)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	echo, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("server: %v", r.err)
	}
	if r.peer != cliID.String() {
		t.Errorf("server saw peer %s, want %s", r.peer, cliID)
	}
	if !bytes.Equal(r.data, msg) || !bytes.Equal(echo, msg) {
		t.Errorf("server read %d bytes, client got %d back, want %d", len(r.data), len(echo), len(msg))
	}
}
