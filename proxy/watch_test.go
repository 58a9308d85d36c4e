package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/proxy/socks5"
)

// TestWatchListeners: proxies whose listeners wait on the engine's watcher
// (Config.WatchListeners, the shared mode's) serve connections through
// them as a goroutine per listener does, many in a row and several open at
// once, while a started proxy adds no goroutine: ten proxies of four
// listeners add at most the watcher itself, where the goroutine per
// listener adds forty. Drain ends their workers (goleak in TestMain).
func TestWatchListeners(t *testing.T) {
	const proxies = 10
	for _, tc := range []struct {
		name  string
		watch bool
		// most is how many goroutines the proxies may add once started.
		most int
	}{
		{"a goroutine per listener", false, 4 * proxies},
		{"on the engine's watcher", true, 1},
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
			before := runtime.NumGoroutine()
			var rigs []*proxyRig
			for range proxies {
				rigs = append(rigs, startProxy(t, yaml, "cli", func(c *Config) {
					c.SOCKS5, c.SOCKS5Port, c.Resolver, c.Engine, c.WatchListeners = true, freePort(t), noDNS, eng, tc.watch
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
		})
	}
}
