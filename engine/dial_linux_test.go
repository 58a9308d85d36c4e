package engine

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// dialBackends are the backends StartDial is checked on: epoll completes
// the connect in its loop, the others dial first.
func dialBackends(t *testing.T) []string {
	names := []string{BackendStd, BackendEpoll}
	if e, err := New(Config{Backend: BackendUring}); err == nil {
		e.Close()
		names = append(names, BackendUring)
	}
	return names
}

// frontConn returns a connected pair: the client's end and the accepted
// end that a proxy would relay.
func frontConn(t *testing.T) (client, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	accepted, err = ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	client.SetDeadline(time.Now().Add(20 * time.Second))
	return client, accepted
}

// stalledListener returns the address of a listener whose accept queue is
// full: a further SYN is dropped, so a connect to it hangs until it times
// out. The address family follows the loopback address given.
func stalledListener(t *testing.T) netip.AddrPort {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port))
	// Fill the queue (a backlog of 0 still queues one connection).
	for range 2 {
		c, err := net.DialTimeout("tcp", addr.String(), 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	return addr
}

func TestStartDial(t *testing.T) {
	tests := []struct {
		name string
		// dst returns where to dial; the server, if any, echoes.
		dst func(t *testing.T) netip.AddrPort
		// abort aborts the relay through its Handle once started.
		abort   bool
		wantErr func(err error) bool
	}{
		{
			name: "connects and relays",
			dst: func(t *testing.T) netip.AddrPort {
				ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ln.Close() })
				go func() {
					c, err := ln.AcceptTCP()
					if err != nil {
						return
					}
					defer c.Close()
					io.Copy(c, c)
					c.CloseWrite()
				}()
				return ln.Addr().(*net.TCPAddr).AddrPort()
			},
			wantErr: func(err error) bool { return err == nil },
		},
		{
			name: "refused",
			dst: func(t *testing.T) netip.AddrPort {
				ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
				if err != nil {
					t.Fatal(err)
				}
				addr := ln.Addr().(*net.TCPAddr).AddrPort()
				ln.Close()
				return addr
			},
			wantErr: func(err error) bool {
				var ce *ConnectError
				return errors.As(err, &ce) && errors.Is(err, syscall.ECONNREFUSED)
			},
		},
		{
			name: "times out",
			dst:  stalledListener,
			wantErr: func(err error) bool {
				var ce *ConnectError
				var ne net.Error
				return errors.As(err, &ce) && errors.As(err, &ne) && ne.Timeout()
			},
		},
		{
			name:    "aborted while connecting",
			dst:     stalledListener,
			abort:   true,
			wantErr: func(err error) bool { return errors.Is(err, ErrAborted) },
		},
	}
	for _, backend := range dialBackends(t) {
		for _, tc := range tests {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				if tc.abort && backend != BackendEpoll {
					t.Skip("only the epoll backend has a connect in flight to abort")
				}
				e, err := New(Config{Backend: backend})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				dst := tc.dst(t)
				client, a := frontConn(t)
				// Sent before the connect completes: it waits for it.
				client.Write([]byte("early"))
				timeout := 300 * time.Millisecond
				if tc.abort {
					timeout = time.Minute // the abort comes first
				}
				d := &Dialer{Options: SocketOptions{KeepAlive: DefaultKeepAlive}, Timeout: timeout}
				counters := new(Counters)
				done := make(chan Result, 1)
				h := e.StartDial(context.Background(), TCPEndpoint{a}, d, netip.Addr{}, dst, counters, func(r Result) { done <- r })
				if tc.abort {
					h.Abort(nil)
				}
				if tc.wantErr(nil) {
					got := make([]byte, 5)
					if _, err := io.ReadFull(client, got); err != nil || string(got) != "early" {
						t.Fatalf("echo read %q, %v", got, err)
					}
					client.CloseWrite()
					if rest, err := io.ReadAll(client); err != nil || len(rest) != 0 {
						t.Fatalf("after the echo: %q, %v; want EOF", rest, err)
					}
				} else {
					// A failed connect resets the client.
					if _, err := io.ReadAll(client); !errors.Is(err, syscall.ECONNRESET) {
						t.Fatalf("client read error %v, want ECONNRESET", err)
					}
				}
				var res Result
				select {
				case res = <-done:
				case <-time.After(20 * time.Second):
					t.Fatal("relay did not end")
				}
				if !tc.wantErr(res.Err) {
					t.Fatalf("relay ended with %v (%T)", res.Err, res.Err)
				}
				if res.Err == nil && (counters.AToB.Load() != 5 || counters.BToA.Load() != 5) {
					t.Fatalf("counters %d/%d, want 5/5", counters.AToB.Load(), counters.BToA.Load())
				}
				if st := e.Stats(); st.LoopRelays != 0 {
					t.Fatalf("%d relays left in the loops", st.LoopRelays)
				}
			})
		}
	}
}

func TestConnectErrorReadsLikeNetDialer(t *testing.T) {
	dst := netip.MustParseAddrPort("10.1.2.3:80")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"refused", unix.ECONNREFUSED, "dial tcp 10.1.2.3:80: connect: connection refused"},
		{"timeout", os.ErrDeadlineExceeded, "dial tcp 10.1.2.3:80: i/o timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := dialError(dst, tc.err).Error(); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
