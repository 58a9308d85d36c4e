package load

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// ThroughputConfig configures a throughput run: Concurrency streams, each
// writing WriteSize chunks to a sink for Duration.
type ThroughputConfig struct {
	Dialer *Dialer
	// Duration of the writing phase. Required, at most MaxDuration.
	Duration time.Duration
	// Concurrency is the number of parallel streams. Default 1.
	Concurrency int
	// WriteSize is the size of each Write. Default 128 KiB.
	WriteSize int
	// Raw sends no header and counts written bytes (any server that reads
	// will do, echo servers included: what comes back is discarded);
	// otherwise the server acknowledges what it received.
	Raw bool
	// Progress, if set, receives a status line about once a second.
	Progress func(string)
}

// Throughput runs the throughput mode.
func Throughput(ctx context.Context, cfg ThroughputConfig) (*ThroughputResult, error) {
	if cfg.Dialer == nil {
		return nil, errors.New("load: no dialer")
	}
	if err := (Bounds{Duration: cfg.Duration}).Validate(); err != nil {
		return nil, err
	}
	var err error
	if cfg.Concurrency, err = concurrency(cfg.Concurrency); err != nil {
		return nil, err
	}
	if cfg.WriteSize <= 0 {
		cfg.WriteSize = 128 << 10
	}
	if cfg.WriteSize > MaxWriteSize {
		return nil, fmt.Errorf("load: write size %d above %d", cfg.WriteSize, MaxWriteSize)
	}
	// Dial every stream first, so that they all write during the same window.
	conns, err := dialAll(ctx, cfg.Dialer, cfg.Concurrency)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	var written atomic.Int64
	stopProgress := progress(ctx, cfg.Progress, func(elapsed time.Duration) string {
		return fmt.Sprintf("throughput %5.1fs  %6.2f Gbit/s written", elapsed.Seconds(), float64(written.Load())*8/elapsed.Seconds()/1e9)
	})
	defer stopProgress()

	type streamResult struct {
		bytes               int64
		start, stopped, end time.Time
		err                 error
	}
	results := make([]streamResult, len(conns))
	buf := make([]byte, cfg.WriteSize) // only read by the writers
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[i]
			r.start = time.Now()
			r.bytes, r.stopped, r.err = runStream(ctx, c, buf, deadline, cfg.Raw, &written)
			r.end = time.Now()
		}()
	}
	wg.Wait()
	res := &ThroughputResult{Streams: len(conns), Acked: !cfg.Raw}
	var first, last time.Time
	for _, r := range results {
		if r.err != nil {
			return nil, r.err
		}
		res.Bytes += r.bytes
		if first.IsZero() || r.start.Before(first) {
			first = r.start
		}
		if r.end.After(last) {
			last = r.end
		}
		res.StreamGbps = append(res.StreamGbps, gbps(r.bytes, r.end.Sub(r.start)))
		res.AckWait = max(res.AckWait, r.end.Sub(r.stopped).Seconds())
	}
	res.Seconds = last.Sub(first).Seconds()
	res.Gbps = gbps(res.Bytes, last.Sub(first))
	return res, nil
}

func gbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) * 8 / d.Seconds() / 1e9
}

// runStream writes until deadline, half-closes, and returns what the server
// acknowledged and when the writing stopped.
func runStream(ctx context.Context, c Conn, buf []byte, deadline time.Time, raw bool, written *atomic.Int64) (n int64, stopped time.Time, err error) {
	// A stuck path must not hang the run: everything ends a while after
	// the deadline at the latest.
	_ = c.SetDeadline(deadline.Add(30 * time.Second))
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if !raw {
		h := Header{Op: OpSink}.Marshal()
		if _, err := c.Write(h[:]); err != nil {
			return 0, time.Now(), fmt.Errorf("load: write header: %w", err)
		}
	}
	if raw {
		// Drain whatever comes back, so that an echo server does not
		// stall the stream once the buffers fill.
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			_, _ = io.Copy(io.Discard, c)
		}()
		defer func() {
			c.Close()
			<-drained
		}()
	}
	var sent int64
	for time.Now().Before(deadline) {
		n, err := c.Write(buf)
		sent += int64(n)
		written.Add(int64(n))
		if err != nil {
			return sent, time.Now(), fmt.Errorf("load: write: %w", err)
		}
	}
	stopped = time.Now()
	if err := c.CloseWrite(); err != nil {
		return sent, stopped, fmt.Errorf("load: close write: %w", err)
	}
	if raw {
		return sent, stopped, nil
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return sent, stopped, fmt.Errorf("load: read the sink's count (after %d bytes sent): %w", sent, err)
	}
	got := int64(binary.BigEndian.Uint64(ack[:]))
	if got != sent {
		return got, stopped, fmt.Errorf("load: sent %d bytes but the server received %d", sent, got)
	}
	return got, stopped, nil
}

// progress calls report(line(elapsed)) every second until the returned
// stop is called; nil report does nothing.
func progress(ctx context.Context, report func(string), line func(time.Duration) string) (stop func()) {
	if report == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				report(line(time.Since(start)))
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
