package load

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// DefaultMaxInFlight is RRConfig.MaxInFlight's default.
const DefaultMaxInFlight = 1024

// MaxInFlight bounds RRConfig.MaxInFlight.
const MaxInFlight = 1 << 20

// seqLen is the size of the sequence number an open-loop run stamps on each
// raw request, so that the reader can tell the echo of one request from
// another's.
const seqLen = 8

// openRR runs RR open loop (RRConfig.OpenRate). Each connection has a
// writer that sends its requests on a fixed schedule, whatever the
// responses do, and a reader that takes the responses in order; between the
// two a bounded queue carries each request's scheduled time. The latency of
// a request counts from its scheduled time, so a target that falls behind
// shows in the latency (no coordinated omission) rather than in a slower
// schedule; a writer on schedule counts from its actual send instead, so
// that the timer's own lateness is not charged to the target.
//
// The run is bounded in count (cfg.Count requests are scheduled, spread over
// the connections) and in time: the schedule ends at cfg.Duration, and each
// response has the dialer's timeout to arrive.
func openRR(ctx context.Context, cfg RRConfig) (*RRResult, error) {
	conns, err := dialAll(ctx, cfg.Dialer, cfg.Concurrency)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	n := cfg.Concurrency
	if cfg.Prime {
		if err := prime(ctx, cfg, conns); err != nil {
			return nil, err
		}
	}
	interval := time.Duration(float64(time.Second) * float64(n) / cfg.OpenRate)
	if interval <= 0 {
		interval = 1
	}
	var stats openStats
	stopProgress := progress(ctx, cfg.Progress, func(elapsed time.Duration) string {
		return fmt.Sprintf("rr open %5.1fs  %9.0f/s  in flight %d  errors %d", elapsed.Seconds(),
			float64(stats.done.Load())/elapsed.Seconds(), stats.sent.Load()-stats.done.Load(), stats.errs.Load())
	})
	defer stopProgress()

	if cfg.OnStart != nil {
		cfg.OnStart(n)
	}
	start := time.Now()
	var end time.Time
	if cfg.Duration > 0 {
		end = start.Add(cfg.Duration)
	}
	ocs := make([]*openConn, n)
	var wg sync.WaitGroup
	for w := range n {
		// The connections' schedules are staggered across one interval.
		first := start.Add(interval * time.Duration(w) / time.Duration(n))
		oc := &openConn{
			c: conns[w], cfg: &cfg, stats: &stats, first: first, interval: interval, end: end,
			planned: planned(cfg, w, first, end, interval), lat: newHistogram(), lag: newHistogram(),
		}
		ocs[w] = oc
		wg.Go(func() { oc.run(ctx) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	lat, lag := newHistogram(), newHistogram()
	var missed, unanswered int64
	for _, oc := range ocs {
		lat.Merge(oc.lat)
		lag.Merge(oc.lag)
		missed += oc.planned - oc.sent
		unanswered += oc.sent - oc.answered
	}
	sendLag := summarize(lag)
	res := &RRResult{
		Concurrency: n, ReqSize: cfg.ReqSize, RespSize: cfg.RespSize, OpenRate: cfg.OpenRate,
		Requests: stats.done.Load(), Errors: stats.errs.Load(),
		Seconds: elapsed.Seconds(), PerSecond: float64(stats.done.Load()) / elapsed.Seconds(),
		Latency: summarize(lat),
		Sent:    stats.sent.Load(), Missed: missed, Unanswered: unanswered, SendLag: &sendLag,
	}
	if p := stats.firstErr.Load(); p != nil {
		res.FirstError = (*p).Error()
	}
	if res.Requests == 0 {
		return res, fmt.Errorf("load: rr open loop: no response arrived (first error: %s)", res.FirstError)
	}
	return res, nil
}

// primeWorkers bounds the connections priming at once.
const primeWorkers = 64

// prime runs one round trip on each connection (RRConfig.Prime), a few
// dozen connections at a time, each within the dialer's timeout. The
// request carries the header, so the schedule's requests do not.
func prime(ctx context.Context, cfg RRConfig, conns []Conn) error {
	timeout := cfg.Dialer.cfg.Timeout
	work := make(chan Conn)
	errs := make(chan error, primeWorkers)
	var wg sync.WaitGroup
	for range min(primeWorkers, len(conns)) {
		wg.Go(func() {
			req := make([]byte, HeaderLen+cfg.ReqSize)
			if !cfg.Raw {
				h := Header{Op: OpRR, Req: uint32(cfg.ReqSize), Resp: uint32(cfg.RespSize)}.Marshal()
				copy(req, h[:])
			} else {
				req = req[HeaderLen:]
				if len(req) >= seqLen {
					// A sequence number no scheduled request has: an
					// echo left unread would fail the reader's check.
					binary.BigEndian.PutUint64(req, ^uint64(0))
				}
			}
			resp := make([]byte, cfg.RespSize)
			for c := range work {
				_ = c.SetDeadline(time.Now().Add(timeout))
				if _, err := c.Write(req); err != nil {
					errs <- fmt.Errorf("load: rr open loop: prime: write: %w", err)
					return
				}
				if _, err := io.ReadFull(c, resp); err != nil {
					errs <- fmt.Errorf("load: rr open loop: prime: read: %w", err)
					return
				}
				_ = c.SetDeadline(time.Time{})
			}
		})
	}
	var err error
feed:
	for _, c := range conns {
		select {
		case work <- c:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

// planned is how many requests connection w of the run is to send: its
// share of cfg.Count and the slots of its schedule before end.
func planned(cfg RRConfig, w int, first, end time.Time, interval time.Duration) int64 {
	p := int64(-1)
	if cfg.Count > 0 {
		n := int64(cfg.Concurrency)
		p = cfg.Count / n
		if int64(w) < cfg.Count%n {
			p++
		}
	}
	if !end.IsZero() {
		slots := int64(0)
		if d := end.Sub(first); d > 0 {
			slots = (int64(d) + int64(interval) - 1) / int64(interval)
		}
		if p < 0 || slots < p {
			p = slots
		}
	}
	return p
}

// openStats are the run's totals, read by the progress line meanwhile.
type openStats struct {
	sent, done, errs atomic.Int64
	firstErr         atomic.Pointer[error]
}

// openConn is one connection of an open-loop run: its writer runs on the
// run's goroutine for it, its reader on one of its own.
type openConn struct {
	c        Conn
	cfg      *RRConfig
	stats    *openStats
	first    time.Time     // the first request's scheduled time
	interval time.Duration // between this connection's requests
	end      time.Time     // no request is scheduled from then on (zero: none)
	planned  int64         // requests to send

	failed atomic.Bool // the connection failed: nothing more is sent

	// Owned by the writer until run's end.
	sent int64
	lag  *hdrhistogram.Histogram // how late each request went out, µs
	// Owned by the reader until run's end.
	answered int64
	lat      *hdrhistogram.Histogram // response time, µs: from the send if on time, else from the slot
}

// slot is a request sent, as the reader needs it.
type slot struct {
	seq uint64
	at  time.Time // scheduled send time
}

func (o *openConn) run(ctx context.Context) {
	maxIn := o.cfg.MaxInFlight
	if maxIn <= 0 {
		maxIn = DefaultMaxInFlight
	}
	queue := make(chan slot, maxIn)
	stop := context.AfterFunc(ctx, func() { o.c.Close() })
	defer stop()
	var rwg sync.WaitGroup
	rwg.Go(func() { o.read(queue) })
	o.write(ctx, queue)
	close(queue)
	rwg.Wait()
}

// fail ends the connection's part of the run with err (the first failure
// counts; what follows it is its consequence).
func (o *openConn) fail(err error) {
	if o.failed.Swap(true) {
		return
	}
	o.stats.errs.Add(1)
	o.stats.firstErr.CompareAndSwap(nil, &err)
	o.c.Close()
}

// write sends the planned requests on schedule. A request goes into the
// queue before it is written, so at most cap(queue) are unanswered; a
// writer held up by a full queue (or a slow socket) sends as soon as it
// can, and its lateness is part of the latency. The schedule ends with ctx,
// at end, or when the connection fails.
func (o *openConn) write(ctx context.Context, queue chan<- slot) {
	wctx := ctx
	if !o.end.IsZero() {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadline(ctx, o.end)
		defer cancel()
	}
	req := make([]byte, HeaderLen+o.cfg.ReqSize)
	if !o.cfg.Raw {
		h := Header{Op: OpRR, Req: uint32(o.cfg.ReqSize), Resp: uint32(o.cfg.RespSize)}.Marshal()
		copy(req, h[:])
	} else {
		req = req[HeaderLen:]
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	timeout := o.cfg.Dialer.cfg.Timeout
	for k := int64(0); k < o.planned && !o.failed.Load(); k++ {
		at := o.first.Add(time.Duration(k) * o.interval)
		s := slot{seq: uint64(k), at: at}
		if wait := time.Until(at); wait > 0 {
			// Every planned slot is before end: only ctx cuts this short.
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			// On schedule: the latency counts from the actual send, as a
			// timer wakes its goroutine up to a millisecond late (the
			// runtime's poller waits in milliseconds); that lateness is the
			// generator's, not the target's (it shows in SendLag).
			s.at = time.Now()
		}
		select {
		case queue <- s:
		default:
			// Held up by MaxInFlight unanswered requests: from now on the
			// request is late because of the target, and its latency
			// counts from its scheduled time.
			s.at = at
			select {
			case queue <- s:
			case <-wctx.Done():
				return
			}
		}
		body := req // the header, if any, goes with the first request
		if !o.cfg.Raw && (k > 0 || o.cfg.Prime) {
			body = req[HeaderLen:]
		}
		if o.cfg.Raw && len(body) >= seqLen {
			binary.BigEndian.PutUint64(body, s.seq)
		}
		_ = o.c.SetWriteDeadline(time.Now().Add(timeout))
		sentAt := time.Now()
		if _, err := o.c.Write(body); err != nil {
			o.fail(fmt.Errorf("load: rr open loop: write: %w", err))
			return
		}
		o.sent++
		o.stats.sent.Add(1)
		_ = o.lag.RecordValue(max(sentAt.Sub(at).Microseconds(), 1))
	}
}

// read takes the responses in order, one per queued request, each within
// the dialer's timeout of the moment the reader starts waiting for it. A
// raw response must echo its request's sequence number. After a failure it
// drains the queue, so the writer is never held up by a dead connection.
func (o *openConn) read(queue <-chan slot) {
	resp := make([]byte, o.cfg.RespSize)
	timeout := o.cfg.Dialer.cfg.Timeout
	check := o.cfg.Raw && o.cfg.RespSize >= seqLen
	for s := range queue {
		if o.failed.Load() {
			continue
		}
		_ = o.c.SetReadDeadline(time.Now().Add(timeout))
		if _, err := io.ReadFull(o.c, resp); err != nil {
			o.fail(fmt.Errorf("load: rr open loop: read: %w", err))
			continue
		}
		if check {
			if got := binary.BigEndian.Uint64(resp); got != s.seq {
				o.fail(fmt.Errorf("load: rr open loop: response to request %d where %d was due", got, s.seq))
				continue
			}
		}
		_ = o.lat.RecordValue(max(time.Since(s.at).Microseconds(), 1))
		o.answered++
		o.stats.done.Add(1)
	}
}
