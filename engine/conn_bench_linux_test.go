package engine_test

import (
	"io"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/engine"
	"github.com/ztunnel-go/ztunnel/engine/enginetest"
)

// BenchmarkMuxRoundTrip: a 1-byte round trip from a TCP client through an
// epoll stream relay and a stream of a Mux to the echo of its MuxPeer's
// reader, with the Mux's connection owned by the relay's loop (loop) or
// driven by a reader and a writer goroutine as today's HBONE connection
// (goroutines); loop-block is loop with the stream loop blocking in
// epoll_wait instead of parking in the netpoller (the design's step 6).
// The MuxPeer's side is the same one goroutine in all.
func BenchmarkMuxRoundTrip(b *testing.B) {
	for _, tc := range []struct {
		name  string
		opt   enginetest.MuxOptions
		block bool // the stream loop blocks in epoll_wait
	}{
		{"loop", enginetest.MuxOptions{}, false},
		{"loop-block", enginetest.MuxOptions{}, true},
		{"goroutines", enginetest.MuxOptions{Goroutines: true}, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e, err := engine.New(engine.Config{Backend: engine.BackendEpoll, Loops: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			if tc.block {
				engine.SetStreamWaitBlock(e)
			}
			x := enginetest.NewMuxFrameEcho(b, e, tc.opt)
			if (x.Mux.Handle() != nil) != !tc.opt.Goroutines {
				b.Fatal("the Mux is not driven the way asked")
			}
			one := []byte{1}
			buf := make([]byte, 1)
			x.RoundTrip(b, one)
			_ = x.Client.SetDeadline(time.Time{})
			b.ResetTimer()
			start, cpu := time.Now(), cpuTime()
			for range b.N {
				if _, err := x.Client.Write(one); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(x.Client, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "ns/rt")
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/rt")
			b.StopTimer()
			x.End(b)
			st := e.Stats()
			b.ReportMetric(float64(st.LocalWakes)/float64(b.N), "localwakes/rt")
		})
	}
}
