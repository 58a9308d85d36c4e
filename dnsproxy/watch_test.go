package dnsproxy

import (
	"context"
	"runtime"
	"slices"
	"testing"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel/engine"
)

// TestServeWatched: a server whose sockets wait on the engine's watcher
// (Config.Watch, the shared mode's) answers local and forwarded names over
// UDP and TCP as one with a goroutine per socket does, while ten started
// servers add no goroutine (at most the watcher itself, where goroutines
// per socket add twenty), and Drain ends what serving started (goleak in
// TestMain).
func TestServeWatched(t *testing.T) {
	eng, err := engine.New(engine.Config{Backend: engine.BackendStd})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	up := startUpstream(t, map[string]string{"A www.bing.com.": "8.8.8.8"})
	before := runtime.NumGoroutine()
	var servers []*Server
	for range 10 {
		servers = append(servers, started(t, Config{Upstreams: []string{up.Addr}, Watch: eng.WatchReadable}))
	}
	if added := runtime.NumGoroutine() - before; added > 1 {
		t.Errorf("10 started servers added %d goroutines, want at most 1 (the watcher)", added)
	}
	for _, s := range servers {
		addr := s.UDPAddrs()[0].String()
		for _, network := range []string{"udp", "tcp"} {
			if got := records(exchange(t, network, addr, query("productpage", dns.TypeA)).Answer); !slices.Equal(got, []string{"productpage. A 9.9.9.9"}) {
				t.Fatalf("%s: local answer %q", network, got)
			}
			if got := records(exchange(t, network, addr, query("www.bing.com", dns.TypeA)).Answer); !slices.Equal(got, []string{"www.bing.com. A 8.8.8.8"}) {
				t.Fatalf("%s: forwarded answer %q", network, got)
			}
		}
	}
	for _, s := range servers {
		s.Drain(context.Background())
	}
}
