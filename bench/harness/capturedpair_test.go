package harness

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
)

// TestHAProxyCapturedPair runs the HAProxy pair behind the capture rules
// for real, in two captured pods on two nodes: a connection the client
// pod makes to either of the server pod's app ports reaches that port
// (the original destination crossed the tunnel in the PROXY header), and
// the app sees the client pod's address (usesrc clientip, replies routed
// back by the capture rules' connmark). Without the pair nothing could
// answer: the client pod's rules redirect every outbound connection to
// 15001, and the server pod's redirect the apps' ports to 15006.
func TestHAProxyCapturedPair(t *testing.T) {
	lab := netnslab.New(t)
	path, err := exec.LookPath("haproxy")
	if err != nil {
		netnslab.Skip(t, "haproxy is not installed (scripts/deps.sh test installs it)")
	}
	pods := map[string]*netnslab.Pod{}
	for _, n := range []string{"a", "b"} {
		node, err := lab.AddNode("n" + n)
		if err != nil {
			t.Fatal(err)
		}
		p, err := node.AddPod("p" + n)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.InstallCapture(); err != nil {
			t.Fatal(err)
		}
		pods[n] = p
	}
	cli, srv := pods["a"], pods["b"]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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
	defer func() {
		for _, c := range b.children {
			c.stop()
		}
	}()

	// The apps: on each port, a line naming the port and the peer's
	// address, then an echo of one line.
	for _, port := range capturedPairPorts {
		ln, err := srv.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
					fmt.Fprintf(c, "port %d from %s\n", port, strings.TrimPrefix(host, "::ffff:"))
					line, err := bufio.NewReader(c).ReadString('\n')
					if err == nil {
						_, _ = c.Write([]byte(line))
					}
				}()
			}
		}()
	}
	if _, _, err := b.startCapturedPair(ctx, cli, srv); err != nil {
		t.Fatal(err)
	}
	for _, port := range capturedPairPorts {
		t.Run(fmt.Sprint(port), func(t *testing.T) {
			c, err := cli.Dial(ctx, "tcp", fmt.Sprintf("%s:%d", srv.IP, port))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			r := bufio.NewReader(c)
			hello, err := r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("port %d from %s\n", port, cli.IP); hello != want {
				t.Fatalf("the app said %q, want %q", hello, want)
			}
			msg := strings.Repeat("captured ", 500) + "\n"
			if _, err := c.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			got, err := r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if got != msg {
				t.Fatal("the echo came back changed")
			}
		})
	}
}
