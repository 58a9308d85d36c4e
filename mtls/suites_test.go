package mtls_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/identity"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/tlstest"
)

// suiteHelperEnv runs the test binary as a plain crypto/tls peer
// ("client ADDR" or "server"), with its certificate in the files named by
// suiteCertEnv and suiteKeyEnv. Started with GODEBUG=cpu.aes=off, crypto/tls
// believes the machine has no AES hardware and prefers
// TLS_CHACHA20_POLY1305_SHA256: as a client it lists it first, as a server
// it picks it.
const (
	suiteHelperEnv = "MTLS_SUITE_HELPER"
	suiteCertEnv   = "MTLS_SUITE_CERT"
	suiteKeyEnv    = "MTLS_SUITE_KEY"
)

// suiteHelper runs the helper role when the environment asks for one; it
// reports whether it did, and the exit code.
func suiteHelper() (int, bool) {
	role := os.Getenv(suiteHelperEnv)
	if role == "" {
		return 0, false
	}
	cert, err := tls.LoadX509KeyPair(os.Getenv(suiteCertEnv), os.Getenv(suiteKeyEnv))
	if err != nil {
		fmt.Println("error:", err)
		return 1, true
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}, Certificates: []tls.Certificate{cert},
		InsecureSkipVerify: true, //nolint:gosec // a test peer: only the suite matters
	}
	var conn *tls.Conn
	if addr, ok := strings.CutPrefix(role, "client "); ok {
		raw, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			fmt.Println("error:", err)
			return 1, true
		}
		conn = tls.Client(raw, cfg)
	} else {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Println("error:", err)
			return 1, true
		}
		fmt.Println("listening", ln.Addr())
		raw, err := ln.Accept()
		ln.Close()
		if err != nil {
			fmt.Println("error:", err)
			return 1, true
		}
		conn = tls.Server(raw, cfg)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := conn.Handshake(); err != nil {
		fmt.Println("handshake:", err)
	} else {
		fmt.Println("negotiated", tls.CipherSuiteName(conn.ConnectionState().CipherSuite))
		// Wait for the peer's verdict: a refusing peer closes.
		conn.Read(make([]byte, 1))
	}
	conn.Close()
	return 0, true
}

// startSuitePeer starts the helper in role, without AES when noAES.
func startSuitePeer(t *testing.T, cert *mtls.WorkloadCert, role string, noAES bool) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	dir := t.TempDir()
	tlstest.WriteFiles(t, dir, cert)
	certFile, keyFile := filepath.Join(dir, "chain.pem"), filepath.Join(dir, "key.pem")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), suiteHelperEnv+"="+role, suiteCertEnv+"="+certFile, suiteKeyEnv+"="+keyFile)
	if noAES {
		cmd.Env = append(cmd.Env, "GODEBUG=cpu.aes=off")
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Wait() })
	return cmd, bufio.NewScanner(out)
}

// TestChaChaRefused: a crypto/tls peer that prefers
// TLS_CHACHA20_POLY1305_SHA256 (no AES hardware, as far as it knows) gets
// it from Go's crypto/tls, which cannot be told otherwise; ztunnel never
// agrees to it, so our side fails the handshake, as server and as client.
// With AES the same peer negotiates AES-GCM and is accepted. (A client
// offering ChaCha20 alone is refused in the handshake:
// TestServerSuiteRefusedInHandshake.)
func TestChaChaRefused(t *testing.T) {
	ca := tlstest.NewCA(t, "cluster.local")
	ours := tlstest.Cert(t, ca, identity.New("cluster.local", "ns", "ours"))
	peer := tlstest.Cert(t, ca, identity.New("cluster.local", "ns", "peer"))
	sans := []string{peer.Identity.String()}

	for _, tc := range []struct {
		name  string
		noAES bool
	}{
		{"peer with AES", false},
		{"peer preferring ChaCha20", true},
	} {
		t.Run("server/"+tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			_, out := startSuitePeer(t, peer, "client "+ln.Addr().String(), tc.noAES)
			raw, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			raw.SetDeadline(time.Now().Add(10 * time.Second))
			conn := tls.Server(raw, mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return ours, nil }))
			checkSuiteOutcome(t, conn.Handshake(), conn, out, tc.noAES)
		})
		t.Run("client/"+tc.name, func(t *testing.T) {
			_, out := startSuitePeer(t, peer, "server", tc.noAES)
			if !out.Scan() || !strings.HasPrefix(out.Text(), "listening ") {
				t.Fatalf("helper: %q", out.Text())
			}
			raw, err := net.DialTimeout("tcp", strings.TrimPrefix(out.Text(), "listening "), 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			raw.SetDeadline(time.Now().Add(10 * time.Second))
			conn := tls.Client(raw, mtls.ClientConfig(ours, sans))
			checkSuiteOutcome(t, conn.Handshake(), conn, out, tc.noAES)
		})
	}
}

// checkSuiteOutcome wants a refusal naming the suite when the peer had no
// AES, an AES-GCM connection otherwise.
func checkSuiteOutcome(t *testing.T, err error, conn *tls.Conn, out *bufio.Scanner, noAES bool) {
	t.Helper()
	if noAES {
		if !errors.Is(err, mtls.ErrCipherSuite) || !strings.Contains(err.Error(), "TLS_CHACHA20_POLY1305_SHA256") {
			t.Fatalf("handshake with a ChaCha20 peer = %v, want ErrCipherSuite naming it", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("handshake with an AES peer: %v", err)
	}
	if s := conn.ConnectionState().CipherSuite; s != tls.TLS_AES_128_GCM_SHA256 && s != tls.TLS_AES_256_GCM_SHA384 {
		t.Fatalf("negotiated %s", tls.CipherSuiteName(s))
	}
	conn.Close()
	for out.Scan() {
		if strings.HasPrefix(out.Text(), "negotiated TLS_AES_") {
			return
		}
	}
	t.Fatal("the helper did not report an AES-GCM handshake")
}

// TestPQCPolicy: COMPLIANCE_POLICY=pqc agrees on X25519MLKEM768 with a
// peer under the same policy and refuses a peer that offers only X25519.
func TestPQCPolicy(t *testing.T) {
	ca := tlstest.NewCA(t, "cluster.local")
	srvCert := tlstest.Cert(t, ca, identity.New("cluster.local", "ns", "srv"))
	cliCert := tlstest.Cert(t, ca, identity.New("cluster.local", "ns", "cli"))
	pqc := mtls.Policy{PQC: true}
	for _, tc := range []struct {
		name   string
		client *tls.Config
		ok     bool
	}{
		{"pqc client", pqc.ClientConfig(cliCert, []string{srvCert.Identity.String()}), true},
		{"classical client", func() *tls.Config {
			c := mtls.ClientConfig(cliCert, []string{srvCert.Identity.String()})
			c.CurvePreferences = []tls.CurveID{tls.X25519}
			return c
		}(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			srv := tls.Server(a, pqc.ServerConfig(func() (*mtls.WorkloadCert, error) { return srvCert, nil }))
			errc := make(chan error, 1)
			go func() { errc <- srv.Handshake() }()
			cli := tls.Client(b, tc.client)
			err := cli.Handshake()
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				if got := cli.ConnectionState().CurveID; got != tls.X25519MLKEM768 {
					t.Errorf("key exchange %v, want X25519MLKEM768", got)
				}
			} else if err == nil {
				t.Fatal("a peer without X25519MLKEM768 was accepted")
			}
			b.Close()
			<-errc
		})
	}
}

// TestServerSuiteRefusedInHandshake: a client that offers only
// TLS_CHACHA20_POLY1305_SHA256 is refused in the handshake with
// handshake_failure, as ztunnel's rustls server (AES-GCM suites only)
// refuses it, not with bad_certificate after the handshake; one that offers
// ChaCha20 first and AES-GCM after gets AES-GCM.
func TestServerSuiteRefusedInHandshake(t *testing.T) {
	ca := tlstest.NewCA(t, "cluster.local")
	ours := tlstest.Cert(t, ca, identity.New("cluster.local", "ns", "ours"))
	for _, tc := range []struct {
		name   string
		suites []uint16
	}{
		{"ChaCha20 only", []uint16{tls.TLS_CHACHA20_POLY1305_SHA256}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			done := make(chan error, 1)
			go func() {
				b, err := ln.Accept()
				if err != nil {
					done <- err
					return
				}
				defer b.Close()
				b.SetDeadline(time.Now().Add(10 * time.Second))
				done <- tls.Server(b, mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return ours, nil })).Handshake()
			}()
			a, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			a.SetDeadline(time.Now().Add(10 * time.Second))
			hello, err := tlstest.ClientHello(tc.suites)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Write(hello); err != nil {
				t.Fatal(err)
			}
			desc, err := tlstest.ReadAlert(a)
			if err != nil || desc != tlstest.AlertHandshakeFailure {
				t.Errorf("answer: alert %d, %v; want handshake_failure (%d)", desc, err, tlstest.AlertHandshakeFailure)
			}
			if err := <-done; err == nil || !strings.Contains(err.Error(), "no cipher suite supported by both client and server") {
				t.Errorf("server handshake: %v, want no mutual cipher suite", err)
			}
		})
	}
}
