package harness

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/bench/load"
	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
)

// newTestBench is a bench for the peers' tests: HAProxy at path, a mesh
// CA in a scratch directory, its children stopped when the test ends.
func newTestBench(t *testing.T, path string) *bench {
	t.Helper()
	b := &bench{o: Options{HAProxy: path}, dir: t.TempDir()}
	ca, err := caclient.NewBuiltinCA("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	b.caCert, b.caKey = filepath.Join(b.dir, "ca-cert.pem"), filepath.Join(b.dir, "ca-key.pem")
	if err := os.WriteFile(b.caCert, ca.RootPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.caKey, ca.KeyPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range b.children {
			c.stop()
		}
	})
	return b
}

// serveEach serves every connection ln accepts with serve, on a goroutine
// of its own, and closes it after; ln closes when the test ends.
func serveEach(t *testing.T, ln net.Listener, serve func(net.Conn)) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); serve(c) }()
		}
	}()
}

// TestHAProxyTLSPeers runs the benchmark's HAProxy TLS peers for real in a
// lab namespace: the pair carries an echo through OpenSSL mTLS both ways,
// and the terminator takes our mTLS client (TLS 1.3, AES-128-GCM, the
// SPIFFE identity checked) and refuses one without a certificate.
func TestHAProxyTLSPeers(t *testing.T) {
	lab := netnslab.New(t)
	path, err := exec.LookPath("haproxy")
	if err != nil {
		netnslab.Skip(t, "haproxy is not installed (scripts/deps.sh test installs it)")
	}
	node, err := lab.AddNode("n")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := node.AddPod("p")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := newTestBench(t, path)

	// The app: an echo server on loopback in the pod.
	ln, err := pod.Listen("tcp", "127.0.0.1:18080")
	if err != nil {
		t.Fatal(err)
	}
	serveEach(t, ln, func(c net.Conn) { _, _ = io.Copy(c, c) })

	srvCrt, err := b.writeHAProxyCert(ctx, peerServerSA)
	if err != nil {
		t.Fatal(err)
	}
	cliCrt, err := b.writeHAProxyCert(ctx, peerClientSA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.startHAProxyTLS(ctx, pod, "server half", haproxyTerminate, "127.0.0.1:18443", 18443, "127.0.0.1:18080", srvCrt); err != nil {
		t.Fatal(err)
	}
	if _, err := b.startHAProxyTLS(ctx, pod, "client half", haproxyOriginate, "127.0.0.1:18001", 18001, "127.0.0.1:18443", cliCrt); err != nil {
		t.Fatal(err)
	}

	echo := func(t *testing.T, c net.Conn) {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := []byte(strings.Repeat("hbone ", 1000))
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if string(got) != string(msg) {
			t.Fatal("the echo came back changed")
		}
	}
	t.Run("pair carries plain TCP over mTLS", func(t *testing.T) {
		c, err := pod.Dial(ctx, "tcp", "127.0.0.1:18001")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		echo(t, c)
	})
	t.Run("terminator takes our mTLS client", func(t *testing.T) {
		wc, err := load.LoadCert(ctx, load.CertConfig{CACert: b.caCert, CAKey: b.caKey, Identity: spiffe(zloadSA)})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := pod.Dial(ctx, "tcp", "127.0.0.1:18443")
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(raw, mtls.ClientConfig(wc, []string{spiffe(peerServerSA)}))
		defer tc.Close()
		if err := tc.HandshakeContext(ctx); err != nil {
			t.Fatal(err)
		}
		cs := tc.ConnectionState()
		if cs.Version != tls.VersionTLS13 || cs.CipherSuite != tls.TLS_AES_128_GCM_SHA256 {
			t.Fatalf("negotiated %s %s, want TLS 1.3 with %s", tls.VersionName(cs.Version), tls.CipherSuiteName(cs.CipherSuite), haproxyTLSSuite)
		}
		echo(t, tc)
	})
	t.Run("terminator refuses a client without a certificate", func(t *testing.T) {
		raw, err := pod.Dial(ctx, "tcp", "127.0.0.1:18443")
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(raw, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})
		defer tc.Close()
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		// TLS 1.3: the client's handshake ends before the server has
		// checked the (missing) certificate; the refusal shows on use.
		err = tc.HandshakeContext(ctx)
		if err == nil {
			_, _ = tc.Write([]byte("x"))
			_, err = tc.Read(make([]byte, 1))
		}
		if err == nil {
			t.Fatal("HAProxy served a client without a certificate")
		}
	})
}
