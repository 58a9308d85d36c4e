package proxy

import (
	"io"
	"testing"
	"time"
)

// BenchmarkDoubleHBONEConnectRate measures new connections per second
// through a network gateway with ztunnel's one inner TLS + HTTP/2 connection
// per connection, and with inner pooling (ZTUNNEL_POOL_INNER_HBONE), side by
// side: each iteration opens one connection of each kind, alternating which
// goes first, so both see the same machine load. A connection is opened,
// carries one byte each way, and is closed. The outer tunnel to the gateway
// is pooled in both.
//
//	go test -run '^$' -bench DoubleHBONEConnectRate -benchtime 2000x ./proxy/
func BenchmarkDoubleHBONEConnectRate(b *testing.B) {
	rigs := [2]*multiNetRig{startMultiNet(b, false), startMultiNet(b, true)}
	routes := [2]outboundRoute{rigs[0].route(b), rigs[1].route(b)}
	var spent [2]time.Duration
	one := func(i int) {
		start := time.Now()
		s, _, err := rigs[i].connect(b, routes[i])
		if err != nil {
			b.Fatal(err)
		}
		buf := []byte{byte(i)}
		if _, err := s.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(s, buf); err != nil {
			b.Fatal(err)
		}
		s.Close()
		spent[i] += time.Since(start)
	}
	// Warm both: the outer connection and the certificates exist before
	// the clock runs, as in a long-running daemon.
	one(0)
	one(1)
	spent = [2]time.Duration{}
	b.ResetTimer()
	for n := range b.N {
		first := n % 2
		one(first)
		one(1 - first)
	}
	b.StopTimer()
	unpooled := float64(b.N) / spent[0].Seconds()
	pooled := float64(b.N) / spent[1].Seconds()
	b.ReportMetric(unpooled, "unpooled-conns/s")
	b.ReportMetric(pooled, "pooled-conns/s")
	b.ReportMetric(pooled/unpooled, "gain-x")
}
