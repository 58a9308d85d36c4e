package engine

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sockInts reads the keepalive and Nagle options of c.
func sockInts(t *testing.T, c *net.TCPConn) map[string]int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	var gerr error
	err = rc.Control(func(fd uintptr) {
		for _, o := range []struct {
			name       string
			level, opt int
		}{
			{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE},
			{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
			{"TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL},
			{"TCP_KEEPCNT", unix.IPPROTO_TCP, unix.TCP_KEEPCNT},
			{"TCP_NODELAY", unix.IPPROTO_TCP, unix.TCP_NODELAY},
			{"TCP_USER_TIMEOUT", unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT},
		} {
			v, err := unix.GetsockoptInt(int(fd), o.level, o.opt)
			if err != nil {
				gerr = err
				return
			}
			got[o.name] = v
		}
	})
	if err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	return got
}

// The proxy sets no option on accepted or dialed sockets after the fact:
// keepalive comes from the listener (copied by the kernel on accept) or is
// set before connect, and TCP_NODELAY from Go. Both sides must end up with
// ztunnel's settings.
func TestKeepAliveAndNoDelayReachEverySocket(t *testing.T) {
	tests := []struct {
		name string
		ka   KeepAlive
		ut   time.Duration
		want map[string]int
	}{
		{"ztunnel defaults", DefaultKeepAlive, 0,
			map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 180, "TCP_KEEPINTVL": 180, "TCP_KEEPCNT": 9, "TCP_NODELAY": 1, "TCP_USER_TIMEOUT": 0}},
		{"zero interval and count take Go's defaults", KeepAlive{Idle: 1500 * time.Millisecond}, 0,
			map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 2, "TCP_KEEPINTVL": 15, "TCP_KEEPCNT": 9, "TCP_NODELAY": 1}},
		{"keepalive off", KeepAlive{}, 0,
			map[string]int{"SO_KEEPALIVE": 0, "TCP_NODELAY": 1}},
		// USER_TIMEOUT_ENABLED: 180s + 9 x 180s, ztunnel's formula.
		{"user timeout", DefaultKeepAlive, 30 * time.Minute,
			map[string]int{"SO_KEEPALIVE": 1, "TCP_USER_TIMEOUT": 1800000, "TCP_NODELAY": 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := SocketOptions{KeepAlive: tc.ka, UserTimeout: tc.ut}
			ctx := context.Background()
			ln, err := Listen(ctx, "127.0.0.1:0", opts)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			d := &Dialer{Options: opts}
			dialed, err := d.Dial(ctx, netip.Addr{}, ln.Addr().(*net.TCPAddr).AddrPort())
			if err != nil {
				t.Fatal(err)
			}
			defer dialed.Close()
			accepted, err := ln.AcceptTCP()
			if err != nil {
				t.Fatal(err)
			}
			defer accepted.Close()
			for side, c := range map[string]*net.TCPConn{"accepted": accepted, "dialed": dialed} {
				got := sockInts(t, c)
				for k, want := range tc.want {
					if got[k] != want {
						t.Errorf("%s socket: %s = %d, want %d", side, k, got[k], want)
					}
				}
			}
		})
	}
}
