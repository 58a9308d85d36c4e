package metrics

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/prometheus/common/expfmt"
)

// BenchmarkConnLifecycle is the per-connection cost of metrics on the hot
// path: ConnOpened (label set lookup, registration) plus Closed.
func BenchmarkConnLifecycle(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		m := New(Config{})
		l := outboundLabels()
		var recv, sent atomic.Int64
		b.ReportAllocs()
		for b.Loop() {
			m.ConnOpened(&l, &recv, &sent).Closed(FlagNone)
		}
	})
	// All goroutines share one label set: the worst case for the series lock.
	b.Run("parallel-same-labels", func(b *testing.B) {
		m := New(Config{})
		l := outboundLabels()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			var recv, sent atomic.Int64
			for pb.Next() {
				m.ConnOpened(&l, &recv, &sent).Closed(FlagNone)
			}
		})
	})
	var id atomic.Int64
	b.Run("parallel-own-labels", func(b *testing.B) {
		m := New(Config{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			l := outboundLabels()
			l.SourceWorkload = fmt.Sprint("w", id.Add(1))
			var recv, sent atomic.Int64
			for pb.Next() {
				m.ConnOpened(&l, &recv, &sent).Closed(FlagNone)
			}
		})
	})
}

// BenchmarkReadCounting compares one relay read (a 16 KiB copy) without
// and with the atomic add the engine does per read; the metrics add
// nothing to it.
func BenchmarkReadCounting(b *testing.B) {
	src, dst := make([]byte, 16<<10), make([]byte, 16<<10)
	b.Run("none", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			copy(dst, src)
		}
	})
	b.Run("counted", func(b *testing.B) {
		var n atomic.Int64
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			n.Add(int64(copy(dst, src)))
		}
	})
}

// BenchmarkScrape10k is a scrape with 10,000 label sets, each with one open
// connection and some closed ones (failed among them).
func BenchmarkScrape10k(b *testing.B) {
	m := New(Config{})
	counters := make([]atomic.Int64, 20000)
	for i := range 10000 {
		l := outboundLabels()
		l.SourceWorkload = fmt.Sprint("client-", i)
		m.ConnOpened(&l, nil, nil).Closed(FlagNone)
		if i%10 == 0 {
			m.ConnOpened(&l, nil, nil).Closed(FlagConnect)
		}
		c := m.ConnOpened(&l, &counters[2*i], &counters[2*i+1])
		defer c.Closed(FlagNone)
		counters[2*i].Add(int64(i))
	}
	b.Run("gather", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.Gatherer().Gather(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gather+text", func(b *testing.B) {
		b.ReportAllocs()
		var buf bytes.Buffer
		for b.Loop() {
			buf.Reset()
			fams, err := m.Gatherer().Gather()
			if err != nil {
				b.Fatal(err)
			}
			enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
			for _, f := range fams {
				enc.Encode(f)
			}
		}
		b.ReportMetric(float64(buf.Len()), "bytes/scrape")
	})
}
