package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/engine"
)

// servePassthrough hands c to the plaintext inbound path (15006) as the
// accept loop would. With no NAT rule in front, c's original destination is
// its own local address, so the listener that accepted c stands for the
// app behind the captured address.
func (r *proxyRig) servePassthrough(c *net.TCPConn) {
	if !r.p.track(c) {
		c.Close()
		return
	}
	r.p.wg.Add(1) // the connection's, as in acceptLoop
	if !r.p.handlePassthrough(c) {
		r.p.release(c)
	}
}

// TestPassthroughInbound: plaintext captured into the pod reaches the app,
// a connect the app refuses resets the client, and both are logged as
// before the connect moved into the engine (engine.StartDial).
func TestPassthroughInbound(t *testing.T) {
	onEachBackend(t, func(t *testing.T, eng *engine.Engine) {
		const yaml = `
workloads:
- uid: u-srv
  name: srv
  namespace: ns
  serviceAccount: srv
  workloadIps: ["127.0.0.1"]
  protocol: TCP
  services: {}
`
		for _, tc := range []struct {
			name    string
			refused bool // nothing listens at the destination any more
		}{
			{"relays to the app", false},
			{"refused connect resets the client", true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				rig := startProxy(t, yaml, "srv", withEngine(eng))
				app, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
				if err != nil {
					t.Fatal(err)
				}
				defer app.Close()
				dst := app.Addr().String()
				client, captured := dialCaptured(t, app)
				if tc.refused {
					app.Close()
				}
				rig.servePassthrough(captured)

				var m map[string]string
				if tc.refused {
					if _, err := io.ReadAll(client); !errors.Is(err, syscall.ECONNRESET) {
						t.Fatalf("client read %v, want a reset", err)
					}
					m = nextLog(t, rig.logs)
					want := fmt.Sprintf("connect to %s: dial tcp %s: connect: connection refused", dst, dst)
					if m["error"] != want {
						t.Fatalf("access log error %q, want %q", m["error"], want)
					}
				} else {
					upstream, err := app.AcceptTCP()
					if err != nil {
						t.Fatal(err)
					}
					echoThrough(t, client, upstream, "plaintext in")
					m = nextLog(t, rig.logs)
					if _, ok := m["error"]; ok {
						t.Fatalf("access log error %q after a clean relay", m["error"])
					}
				}
				if m["msg"] != "connection complete" || m["direction"] != "inbound" || m["dst.addr"] != dst || m["src.addr"] != client.LocalAddr().String() {
					t.Fatalf("access log %v, want a complete inbound connection %s -> %s", m, client.LocalAddr(), dst)
				}
			})
		}
	})
}

// TestPassthroughConnectInEngine: on the epoll backend the engine's event
// loop completes the connect to the app, so serving a captured connection
// does not wait for it. The app's accept queue is full, so the kernel drops
// the connect's SYNs until the test drains the queue, after
// servePassthrough has returned; a serve that dialed first would wait until
// its connect timed out and reset the client.
func TestPassthroughConnectInEngine(t *testing.T) {
	e, err := engine.New(engine.Config{Backend: engine.BackendEpoll})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() }) // after the proxy's cleanup
	const yaml = `
workloads:
- {uid: u-srv, name: srv, namespace: ns, serviceAccount: srv, workloadIps: ["127.0.0.1"], protocol: TCP, services: {}}
`
	rig := startProxy(t, yaml, "srv", withEngine(e))
	app := tinyBacklogListener(t)
	client, captured := dialCaptured(t, app)
	// The filler takes the queue's one place.
	filler, err := net.DialTCP("tcp", nil, app.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	rig.servePassthrough(captured)

	app.SetDeadline(time.Now().Add(20 * time.Second))
	queued, err := app.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	queued.Close()
	// The connect's next SYN gets through now.
	upstream, err := app.AcceptTCP()
	if err != nil {
		t.Fatalf("the connect to the app did not survive until its queue drained: %v", err)
	}
	echoThrough(t, client, upstream, "after the queue drained")
	if m := nextLog(t, rig.logs); m["msg"] != "connection complete" || m["error"] != "" {
		t.Fatalf("access log %v, want a clean complete connection", m)
	}
}

// dialCaptured connects a client to app, which stands for the app behind a
// captured address, and returns both ends: the client's (closed at the
// test's end) and the one the capture would have handed the proxy.
func dialCaptured(t *testing.T, app *net.TCPListener) (client, captured *net.TCPConn) {
	t.Helper()
	client, err := net.DialTCP("tcp", nil, app.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	client.SetDeadline(time.Now().Add(20 * time.Second))
	captured, err = app.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	return client, captured
}

// echoThrough echoes on upstream, the app's end of a relayed connection,
// and checks that msg sent from client comes back through the relay.
func echoThrough(t *testing.T, client, upstream *net.TCPConn, msg string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer upstream.Close()
		io.Copy(upstream, upstream)
		upstream.CloseWrite()
	}()
	got, err := echoOver(client, msg)
	<-done
	if err != nil || got != msg {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

// tinyBacklogListener listens on loopback with a backlog of 0: its accept
// queue holds one connection, and SYNs beyond it are dropped.
func tinyBacklogListener(t *testing.T) *net.TCPListener {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "app")
	defer f.Close()
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.(*net.TCPListener)
}
