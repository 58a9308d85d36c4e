package admin

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// bound is how long a test waits for what must happen, far past every
// timeout the tests configure: reaching it fails the test, it never
// measures speed.
const bound = 10 * time.Second

// limitRig is a server under test with what it refused and logged.
type limitRig struct {
	srv     *HTTPServer
	refused chan string // "name/reason" per refusal
	logs    *syncBuffer
}

// syncBuffer is a log sink the server writes from its goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startLimited serves h on 127.0.0.1 as "readiness" under lim.
func startLimited(t *testing.T, h http.Handler, lim Limits) *limitRig {
	t.Helper()
	r := &limitRig{refused: make(chan string, 1024), logs: new(syncBuffer)}
	srv, err := Serve(ServeConfig{
		Name: "readiness", Addr: "127.0.0.1:0", Handler: h, Limits: lim,
		Logger:    slog.New(slog.NewTextHandler(r.logs, nil)),
		OnRefused: func(name string, reason RefusalReason) { r.refused <- name + "/" + string(reason) },
	})
	if err != nil {
		t.Fatal(err)
	}
	r.srv = srv
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return r
}

// tryDialFrom connects to the rig from the source address src (any of
// 127.0.0.0/8 is local on Linux), so that tests have distinct peers.
func (r *limitRig) tryDialFrom(src string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return d.Dial("tcp", r.srv.Addr().String())
}

// dialFrom is tryDialFrom for a connection that must be made; the test's
// cleanup closes it.
func (r *limitRig) dialFrom(t *testing.T, src string) net.Conn {
	t.Helper()
	c, err := r.tryDialFrom(src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitRefused waits for n refusals and checks they are all want.
func (r *limitRig) waitRefused(t *testing.T, n int, want string) {
	t.Helper()
	timeout := time.After(bound)
	for i := range n {
		select {
		case got := <-r.refused:
			if got != want {
				t.Fatalf("refusal %d: %s, want %s", i, got, want)
			}
		case <-timeout:
			t.Fatalf("%d refusals counted, want %d", i, n)
		}
	}
	select {
	case got := <-r.refused:
		t.Fatalf("refusal beyond the %d expected: %s", n, got)
	default:
	}
}

// request sends one GET on c and reads the response; closing asks the
// server to close c after it.
func request(t *testing.T, c net.Conn, path string, closing bool) (*http.Response, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(bound))
	defer c.SetDeadline(time.Time{})
	req := "GET " + path + " HTTP/1.1\r\nHost: test\r\n"
	if closing {
		req += "Connection: close\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// closedByServer waits for the server to end c: EOF or a reset, whatever
// it answered before. It fails the test if c is still open after bound.
func closedByServer(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(bound))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open after %v", bound)
	}
}

// TestConnectionCaps floods the server with idle connections from one
// peer (127.0.0.1): those over the cap are refused at once (reset, the
// refusal counted, logged with backoff), while the caps leave room for
// another peer (127.0.0.2) where they should, and a freed place is taken
// again.
func TestConnectionCaps(t *testing.T) {
	const flood = 20
	for _, tc := range []struct {
		name          string
		perPeer, max  int
		held          int    // connections the first peer gets
		reason        string // of the first peer's refusals
		otherRefused  bool   // whether the second peer is refused too
		otherReason   string
		freedForOther bool // a place the first peer frees goes to the second
	}{
		{name: "per peer", perPeer: 4, max: 100, held: 4, reason: "readiness/peer"},
		{name: "total", perPeer: 100, max: 4, held: 4, reason: "readiness/total", otherRefused: true, otherReason: "readiness/total", freedForOther: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Long timeouts: the held connections stay until the test
			// ends them.
			r := startLimited(t, NewReadiness(), Limits{MaxConnsPerPeer: tc.perPeer, MaxConns: tc.max, HeaderTimeout: time.Minute, IdleTimeout: time.Minute})
			var held []net.Conn
			for range tc.held {
				held = append(held, r.dialFrom(t, "127.0.0.1"))
			}
			// The held ones are served (the backlog is accepted in order,
			// so they are the admitted ones).
			for _, c := range held {
				if resp, _ := request(t, c, "/healthz/ready", false); resp.StatusCode != http.StatusOK {
					t.Fatalf("held connection: status %d", resp.StatusCode)
				}
			}
			for range flood {
				// The reset may come before the dial has seen its
				// connection established.
				if c, err := r.tryDialFrom("127.0.0.1"); err == nil {
					closedByServer(t, c)
					c.Close()
				}
			}
			r.waitRefused(t, flood, tc.reason)
			logged := strings.Count(r.logs.String(), "connection refused")
			if logged == 0 || logged >= flood || !strings.Contains(r.logs.String(), "peer=127.0.0.1") {
				t.Errorf("%d refusals logged in %d lines, want the first and fewer than all:\n%s", flood, logged, r.logs.String())
			}

			if tc.otherRefused {
				if other, err := r.tryDialFrom("127.0.0.2"); err == nil {
					closedByServer(t, other)
					other.Close()
				}
				r.waitRefused(t, 1, tc.otherReason)
			} else if resp, body := request(t, r.dialFrom(t, "127.0.0.2"), "/healthz/ready", true); resp.StatusCode != http.StatusOK || body != "ready\n" {
				t.Fatalf("second peer: %d %q, want 200 ready", resp.StatusCode, body)
			}
			// The held connections are still served.
			if resp, _ := request(t, held[0], "/healthz/ready", false); resp.StatusCode != http.StatusOK {
				t.Fatalf("held connection after the flood: status %d", resp.StatusCode)
			}
			if tc.freedForOther {
				request(t, held[1], "/healthz/ready", true)
				closedByServer(t, held[1])
				if resp, _ := request(t, r.dialFrom(t, "127.0.0.2"), "/healthz/ready", true); resp.StatusCode != http.StatusOK {
					t.Fatalf("second peer after a place was freed: status %d", resp.StatusCode)
				}
			}
		})
	}
}

// TestConnectionTimeouts checks each timeout ends a connection that holds
// the server without progress: a head that never completes (slowloris),
// a keep-alive connection left idle, a body sent too slowly (to a handler
// that does not read it: the server discards it), a client that stops
// reading a long response.
func TestConnectionTimeouts(t *testing.T) {
	const short = 100 * time.Millisecond
	bigWrites := make(chan error, 1)
	mux := http.NewServeMux()
	mux.Handle("/healthz/ready", NewReadiness())
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		_, err := w.Write(make([]byte, 64<<20))
		bigWrites <- err
	})
	for _, tc := range []struct {
		name string
		lim  Limits
		do   func(t *testing.T, c net.Conn) // leaves c for the server to end
	}{
		{
			name: "request head never completed",
			lim:  Limits{HeaderTimeout: short},
			do: func(t *testing.T, c net.Conn) {
				io.WriteString(c, "GET /healthz/ready HTTP/1.1\r\nHost: test\r\nX-Slow: a")
			},
		},
		{
			name: "nothing sent",
			lim:  Limits{HeaderTimeout: short},
			do:   func(t *testing.T, c net.Conn) {},
		},
		{
			name: "keep-alive connection left idle",
			lim:  Limits{IdleTimeout: short, HeaderTimeout: time.Minute},
			do: func(t *testing.T, c net.Conn) {
				if resp, _ := request(t, c, "/healthz/ready", false); resp.StatusCode != http.StatusOK || resp.Close {
					t.Fatalf("status %d, close %v: want a kept-alive 200", resp.StatusCode, resp.Close)
				}
			},
		},
		{
			name: "body sent too slowly",
			lim:  Limits{ReadTimeout: short, HeaderTimeout: time.Minute, IdleTimeout: time.Minute},
			do: func(t *testing.T, c net.Conn) {
				io.WriteString(c, "POST /healthz/ready HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n0123456789")
			},
		},
		{
			name: "response not read",
			lim:  Limits{WriteTimeout: short, HeaderTimeout: time.Minute, IdleTimeout: time.Minute},
			do: func(t *testing.T, c net.Conn) {
				io.WriteString(c, "GET /big HTTP/1.1\r\nHost: test\r\n\r\n")
				select {
				case err := <-bigWrites:
					if err == nil {
						t.Fatal("64 MiB written to a client that reads nothing")
					}
				case <-time.After(bound):
					t.Fatalf("the write to a client that reads nothing still blocks after %v", bound)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startLimited(t, mux, tc.lim)
			c := r.dialFrom(t, "127.0.0.1")
			tc.do(t, c)
			closedByServer(t, c)
		})
	}
}

// TestLongResponsesOutliveWriteTimeout: WriteTimeout bounds a stall, not a
// response. A CPU profile writes nothing for its seconds, then the
// profile; a large body goes to a client that reads it steadily over more
// than WriteTimeout.
func TestLongResponsesOutliveWriteTimeout(t *testing.T) {
	const writeTimeout = 300 * time.Millisecond
	const bigSize = 32 << 20 // more than the socket buffers hold
	adm := testServer(t)
	mux := http.NewServeMux()
	mux.Handle("/debug/", adm)
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, bigSize)) // one Write, as json.Encoder does for /config_dump
	})
	r := startLimited(t, mux, Limits{WriteTimeout: writeTimeout})

	t.Run("CPU profile", func(t *testing.T) {
		start := time.Now()
		resp, body := request(t, r.dialFrom(t, "127.0.0.1"), "/debug/pprof/profile?seconds=1", true)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if took := time.Since(start); took < time.Second {
			t.Fatalf("profile answered after %v, before its 1s", took)
		}
		if _, err := profile.ParseData([]byte(body)); err != nil {
			t.Fatalf("not a profile: %v", err)
		}
	})
	t.Run("large body read steadily", func(t *testing.T) {
		c := r.dialFrom(t, "127.0.0.1")
		io.WriteString(c, "GET /big HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(bound))
		// 1 MiB per writeTimeout/6: the whole takes about 5 x
		// writeTimeout, and the server waits about a sixth of it for
		// room.
		total := 0
		buf := make([]byte, 1<<20)
		for {
			n, err := io.ReadFull(c, buf)
			total += n
			if err != nil {
				break
			}
			time.Sleep(writeTimeout / 6) // the client's pace, not a wait for a condition
		}
		if total < bigSize {
			t.Fatalf("read %d bytes, want the %d-byte body", total, bigSize)
		}
	})
}

// TestMaxHeaderBytes: a request head of ztunnel's 8 KiB is the most
// served; a bigger one gets 431.
func TestMaxHeaderBytes(t *testing.T) {
	r := startLimited(t, NewReadiness(), Limits{})
	for _, tc := range []struct {
		pad  int
		want int
	}{
		{pad: 7 << 10, want: http.StatusOK},
		{pad: 9 << 10, want: http.StatusRequestHeaderFieldsTooLarge},
	} {
		t.Run(fmt.Sprint(tc.pad), func(t *testing.T) {
			c := r.dialFrom(t, "127.0.0.1")
			if resp, _ := request(t, c, "/healthz/ready?"+strings.Repeat("x", tc.pad), true); resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

// TestRefusalLogBackoff: the first refusal of a flood is logged, then one
// line per interval doubling from refusalLogMin to refusalLogMax; a quiet
// period starts over.
func TestRefusalLogBackoff(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	type step struct {
		at         time.Duration // since t0
		logged     bool
		suppressed int
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first logged, then spaced", []step{
			{0, true, 0}, {10 * time.Millisecond, false, 0}, {500 * time.Millisecond, false, 0},
			{time.Second, true, 2}, // wait 1 s, now 2 s
			{2 * time.Second, false, 0},
			{3 * time.Second, true, 1}, // now 4 s
			{6 * time.Second, false, 0},
			{7 * time.Second, true, 1}, // now 8 s
		}},
		{"capped at the maximum", []step{
			{0, true, 0}, {1 * time.Second, true, 0}, {3 * time.Second, true, 0}, {7 * time.Second, true, 0},
			{15 * time.Second, true, 0}, {31 * time.Second, true, 0}, {63 * time.Second, true, 0}, // wait now 60 s
			{63*time.Second + refusalLogMax - time.Millisecond, false, 0},
			{63*time.Second + refusalLogMax, true, 1},
		}},
		{"a quiet period starts over", []step{
			{0, true, 0}, {1 * time.Second, true, 0}, {3 * time.Second, true, 0}, // wait now 4 s
			{3*time.Second + 4*time.Second + refusalLogMax, true, 0}, // wait back to 1 s
			{3*time.Second + 4*time.Second + refusalLogMax + 500*time.Millisecond, false, 0},
			{3*time.Second + 4*time.Second + refusalLogMax + time.Second, true, 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l refusalLog
			for i, s := range tc.steps {
				ok, suppressed := l.take(t0.Add(s.at))
				if ok != s.logged || suppressed != s.suppressed {
					t.Fatalf("step %d (at %v): logged %v with %d unlogged, want %v with %d", i, s.at, ok, suppressed, s.logged, s.suppressed)
				}
			}
		})
	}
}

// TestServeAddresses: "localhost:PORT" listens on both loopbacks, as
// ztunnel's Address::Localhost, and on 127.0.0.1 alone with IPv4Only
// (IPV6_ENABLED=false); an IPv4 wildcard takes no IPv6 connection.
func TestServeAddresses(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	get := func(url string) error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	for _, tc := range []struct {
		addr         string
		ipv4Only     bool
		v4, v6       bool
		wantListener int
	}{
		{"localhost:0", false, true, true, 2},
		{"localhost:0", true, true, false, 1},
		{"0.0.0.0:0", false, true, false, 1},
		{"[::]:0", false, true, true, 1},
	} {
		t.Run(fmt.Sprintf("%s_ipv4only=%v", tc.addr, tc.ipv4Only), func(t *testing.T) {
			s, err := Serve(ServeConfig{Name: "test", Addr: tc.addr, IPv4Only: tc.ipv4Only, Handler: ok})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Shutdown(context.Background())
			if n := len(s.Addrs()); n != tc.wantListener {
				t.Fatalf("%d listeners (%v), want %d", n, s.Addrs(), tc.wantListener)
			}
			port := s.Addr().(*net.TCPAddr).Port
			if err := get(fmt.Sprintf("http://127.0.0.1:%d/", port)); (err == nil) != tc.v4 {
				t.Errorf("over IPv4: %v, want served %v", err, tc.v4)
			}
			if err := get(fmt.Sprintf("http://[::1]:%d/", port)); (err == nil) != tc.v6 {
				t.Errorf("over IPv6: %v, want served %v", err, tc.v6)
			}
		})
	}
}
