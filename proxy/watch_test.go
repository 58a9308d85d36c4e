package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/internal/nettest"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
)

// TestWatchListeners: proxies whose listeners wait on the engine's watcher
// (Config.WatchListeners, the shared mode's) serve connections through
// them as a goroutine per listener does, many in a row and several open at
// once, while a started proxy adds no goroutine: ten proxies of four
// listeners add at most the watcher itself, where the goroutine per
// listener adds forty. With a shared Workers pool, the idle workers left
// are as many as connections were served at once, not three per proxy.
// Drain (and Workers.Close) end them (goleak in TestMain).
func TestWatchListeners(t *testing.T) {
	const proxies = 10
	for _, tc := range []struct {
		name   string
		watch  bool
		shared bool // a Workers pool for all the proxies
		// most is how many goroutines the proxies may add once started;
		// mostIdle how many once each has served three connections at
		// once (idle workers).
		most, mostIdle int
	}{
		{"a goroutine per listener", false, false, 4 * proxies, 4*proxies + 3*proxies},
		{"on the engine's watcher", true, false, 1, 1 + 3*proxies},
		// The pool keeps as many workers as connections were served at
		// once: three.
		{"on the watcher with shared workers", true, true, 1, 1 + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng, err := engine.New(engine.Config{Backend: engine.BackendEpoll})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { eng.Close() })
			app := echoApp(t)
			yaml := `
workloads:
- uid: u-cli
  name: cli
  namespace: ns
  serviceAccount: cli
  workloadIps: ["127.0.0.2"]
  protocol: TCP
  services: {}
`
			var workers *Workers
			if tc.shared {
				workers = NewWorkers()
				// After the rigs' cleanups (registered later, run first).
				t.Cleanup(workers.Close)
			}
			before := runtime.NumGoroutine()
			var rigs []*proxyRig
			for range proxies {
				rigs = append(rigs, startProxy(t, yaml, "cli", func(c *Config) {
					c.SOCKS5, c.SOCKS5Port, c.Resolver, c.Engine, c.WatchListeners = true, freePort(t), noDNS, eng, tc.watch
					c.Workers = workers
				}))
			}
			if added := runtime.NumGoroutine() - before; added > tc.most {
				t.Errorf("%d started proxies added %d goroutines, want at most %d", proxies, added, tc.most)
			}
			target := socks5.Target{Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(app))}
			for i, rig := range rigs {
				// Three open at once on one listener, then each used.
				var conns []net.Conn
				for j := range 3 {
					c, rep, err := rig.socksDial(t, target)
					if err != nil || rep != socks5.ReplySucceeded {
						t.Fatalf("proxy %d, connection %d: handshake %v, %v", i, j, rep, err)
					}
					conns = append(conns, c)
				}
				for j, c := range conns {
					msg := fmt.Sprintf("proxy %d connection %d", i, j)
					if got, err := echoOver(c, msg); err != nil || got != msg {
						t.Fatalf("echo: %q, %v", got, err)
					}
				}
			}
			// Every connection has ended (its echo read to EOF): what the
			// proxies added now is listeners' goroutines and idle workers.
			// Relays end on the engine's loops a moment after the echo;
			// wait for the count to settle at or under the bound, well
			// within workerIdle (idle workers end after it).
			var added int
			nettest.Until(workerIdle/2, func() bool {
				added = runtime.NumGoroutine() - before
				return added <= tc.mostIdle
			})
			if added > tc.mostIdle {
				t.Errorf("after serving, the proxies hold %d goroutines, want at most %d", added, tc.mostIdle)
			}
		})
	}
}
