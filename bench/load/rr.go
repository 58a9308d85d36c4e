package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// RRConfig configures a request/response run (RR) or a connection-rate run
// (CPS).
type RRConfig struct {
	Dialer *Dialer
	// Bounds stop the run (count is of transactions, across all workers).
	Bounds
	// Concurrency is the number of workers, each with its own connection
	// (RR) or opening connections one after another (CPS). Default 1.
	Concurrency int
	// ReqSize and RespSize are the message sizes. Default 1 byte each.
	ReqSize, RespSize int
	// Rate, if positive, is the total transactions per second, spread over
	// the workers (paced, but each worker still waits for a response before
	// its next request: see OpenRate for a true open loop). A worker behind
	// schedule counts latency from the scheduled start, so a stall of the
	// target is not hidden (coordinated omission); one on schedule counts
	// from the actual send. Zero runs closed loop.
	Rate float64
	// OpenRate, if positive, runs RR open loop at this total rate of
	// requests per second, spread evenly over the connections: on each, a
	// writer sends on a fixed schedule whatever the responses do, and a
	// reader takes the responses in order; latency counts from each
	// request's scheduled time (from its actual send while the writer is on
	// schedule, so that timer lateness is not charged to the target; see
	// RRResult.SendLag). Rate must then be zero. Count bounds the
	// requests scheduled, Duration the schedule; each response has the
	// dialer's timeout. Raw requests of 8 bytes or more carry a sequence
	// number the echo must return in order.
	OpenRate float64
	// MaxInFlight bounds, per connection of an open-loop run, the requests
	// sent and not yet answered (default DefaultMaxInFlight): a writer that
	// reaches it waits.
	MaxInFlight int
	// OnStart, if set, is called once an open-loop run has dialed all its
	// connections and its schedule starts, with their number: a harness
	// that reads the proxies' CPU over a window of the steady state (not
	// the burst of set-ups before it) waits for it.
	OnStart func(conns int)
	// Prime has each connection of an open-loop run complete one round
	// trip (not counted) before the schedule starts: a path that finishes
	// a connection's set-up behind the client's connect (a TCP proxy's
	// upstream TLS handshake) has then finished it for every connection,
	// and the schedule measures the steady state.
	Prime bool
	// Raw sends no header. RR then needs an echo server (RespSize is forced
	// to ReqSize), and CPS closes from the client side.
	Raw bool
	// Progress, if set, receives a status line about once a second.
	Progress func(string)
}

func (cfg *RRConfig) check() error {
	if cfg.Dialer == nil {
		return errors.New("load: no dialer")
	}
	if err := cfg.Bounds.Validate(); err != nil {
		return err
	}
	var err error
	if cfg.Concurrency, err = concurrency(cfg.Concurrency); err != nil {
		return err
	}
	if cfg.ReqSize <= 0 {
		cfg.ReqSize = 1
	}
	if cfg.RespSize <= 0 {
		cfg.RespSize = 1
	}
	if cfg.Raw {
		cfg.RespSize = cfg.ReqSize
	}
	if cfg.ReqSize > MaxMessage || cfg.RespSize > MaxMessage {
		return fmt.Errorf("load: message sizes above %d", MaxMessage)
	}
	if cfg.Rate < 0 || cfg.Rate > MaxRate {
		return fmt.Errorf("load: rate %v outside [0, %d]", cfg.Rate, MaxRate)
	}
	if cfg.OpenRate < 0 || cfg.OpenRate > MaxRate {
		return fmt.Errorf("load: open rate %v outside [0, %d]", cfg.OpenRate, MaxRate)
	}
	if cfg.OpenRate > 0 && cfg.Rate > 0 {
		return errors.New("load: a rate and an open rate exclude each other")
	}
	if cfg.MaxInFlight < 0 || cfg.MaxInFlight > MaxInFlight {
		return fmt.Errorf("load: max in flight %d outside [0, %d]", cfg.MaxInFlight, MaxInFlight)
	}
	return nil
}

// RR runs the request/response mode: each worker sends a request on its
// connection and waits for the response, again and again; with
// cfg.OpenRate, requests go out on a fixed schedule instead, pipelined
// (see RRConfig.OpenRate).
func RR(ctx context.Context, cfg RRConfig) (*RRResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.OpenRate > 0 {
		return openRR(ctx, cfg)
	}
	conns, err := dialAll(ctx, cfg.Dialer, cfg.Concurrency)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	return runWorkers(ctx, cfg, "rr", func(ctx context.Context, w int, txn txnFunc) error {
		c := conns[w]
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		req := make([]byte, HeaderLen+cfg.ReqSize)
		if !cfg.Raw {
			h := Header{Op: OpRR, Req: uint32(cfg.ReqSize), Resp: uint32(cfg.RespSize)}.Marshal()
			copy(req, h[:])
		} else {
			req = req[HeaderLen:]
		}
		resp := make([]byte, cfg.RespSize)
		first := true
		for {
			ok, err := txn(func() error {
				_ = c.SetDeadline(time.Now().Add(cfg.Dialer.cfg.Timeout))
				if _, err := c.Write(req); err != nil {
					return err
				}
				if first && !cfg.Raw {
					first = false
					req = req[HeaderLen:]
				}
				_, err := io.ReadFull(c, resp)
				return err
			})
			if err != nil || !ok {
				if ctx.Err() != nil {
					return nil // stopped while in flight
				}
				return err
			}
		}
	})
}

// CPS runs the connection-rate mode: each transaction is a new connection
// carrying one request and its response, closed by the server first.
func CPS(ctx context.Context, cfg RRConfig) (*RRResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return runWorkers(ctx, cfg, "cps", func(ctx context.Context, _ int, txn txnFunc) error {
		msg := make([]byte, HeaderLen+cfg.ReqSize)
		if !cfg.Raw {
			h := Header{Op: OpOnce, Req: uint32(cfg.ReqSize), Resp: uint32(cfg.RespSize)}.Marshal()
			copy(msg, h[:])
		} else {
			msg = msg[HeaderLen:]
		}
		resp := make([]byte, cfg.RespSize+1)
		consecutive := 0
		for {
			ok, err := txn(func() error {
				c, err := cfg.Dialer.Dial(ctx)
				if err != nil {
					return err
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(cfg.Dialer.cfg.Timeout))
				if _, err := c.Write(msg); err != nil {
					return err
				}
				if cfg.Raw {
					_, err = io.ReadFull(c, resp[:cfg.RespSize])
					return err
				}
				// The response, then EOF: the server closes first.
				n, err := io.ReadFull(c, resp)
				if n == cfg.RespSize && errors.Is(err, io.ErrUnexpectedEOF) {
					return nil
				}
				if err == nil {
					return fmt.Errorf("load: server sent more than %d bytes", cfg.RespSize)
				}
				if n < cfg.RespSize && errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return err
			})
			if !ok {
				return nil
			}
			if err != nil {
				// A connection rate test tolerates failed connections
				// (counted), but not a dead target.
				if consecutive++; consecutive >= 20 {
					return fmt.Errorf("load: 20 connections in a row failed: %w", err)
				}
				continue
			}
			consecutive = 0
		}
	})
}

// txnFunc runs one transaction if the run is not over: it paces the worker
// (Rate), times fn, records the latency or counts the error. ok is false
// when the run is over (fn was not run).
type txnFunc func(fn func() error) (ok bool, err error)

// runWorkers runs cfg.Concurrency workers until the bounds are reached, and
// merges their histograms.
func runWorkers(ctx context.Context, cfg RRConfig, name string, worker func(ctx context.Context, w int, txn txnFunc) error) (*RRResult, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var end time.Time
	if cfg.Duration > 0 {
		end = time.Now().Add(cfg.Duration)
		var c context.CancelFunc
		runCtx, c = context.WithDeadline(runCtx, end)
		defer c()
	}
	// over also looks at the clock: an operation bounded by runCtx's deadline
	// fails at that instant, before runCtx reports Done.
	over := func() bool {
		return runCtx.Err() != nil || (!end.IsZero() && !time.Now().Before(end))
	}
	var (
		done     atomic.Int64 // transactions completed
		claimed  atomic.Int64 // transactions started (for Count)
		errCount atomic.Int64
		firstErr atomic.Pointer[error]
	)
	stopProgress := progress(ctx, cfg.Progress, func(elapsed time.Duration) string {
		return fmt.Sprintf("%s %5.1fs  %9.0f/s  errors %d", name, elapsed.Seconds(), float64(done.Load())/elapsed.Seconds(), errCount.Load())
	})
	defer stopProgress()

	hists := make([]*hdrhistogram.Histogram, cfg.Concurrency)
	errs := make([]error, cfg.Concurrency)
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(cfg.Concurrency) / cfg.Rate)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for w := range cfg.Concurrency {
		h := newHistogram()
		hists[w] = h
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Stagger the workers' schedules across one interval.
			next := start.Add(interval * time.Duration(w) / time.Duration(cfg.Concurrency))
			txn := func(fn func() error) (bool, error) {
				if over() {
					return false, nil
				}
				if cfg.Count > 0 && claimed.Add(1) > cfg.Count {
					return false, nil
				}
				t0 := time.Now()
				if interval > 0 {
					if wait := next.Sub(t0); wait > 0 {
						// On schedule: count from the actual send, so the
						// timer's own lateness is not charged to the target.
						select {
						case <-runCtx.Done():
							return false, nil
						case <-time.After(wait):
						}
						t0 = time.Now()
					} else {
						// Behind schedule because the target was slow:
						// count from the intended start (no coordinated
						// omission).
						t0 = next
					}
					next = next.Add(interval)
				}
				err := fn()
				if err != nil {
					if over() {
						return false, nil
					}
					errCount.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					return true, err
				}
				us := time.Since(t0).Microseconds()
				_ = h.RecordValue(max(us, 1)) // values above 60 s saturate
				done.Add(1)
				return true, nil
			}
			errs[w] = worker(runCtx, w, txn)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	all := newHistogram()
	for _, h := range hists {
		all.Merge(h)
	}
	res := &RRResult{
		Concurrency: cfg.Concurrency, ReqSize: cfg.ReqSize, RespSize: cfg.RespSize, Rate: cfg.Rate,
		Requests: done.Load(), Errors: errCount.Load(),
		Seconds: elapsed.Seconds(), PerSecond: float64(done.Load()) / elapsed.Seconds(),
		Latency: summarize(all),
	}
	if p := firstErr.Load(); p != nil {
		res.FirstError = (*p).Error()
	}
	for _, err := range errs {
		if err != nil {
			return res, fmt.Errorf("load: %s worker: %w", name, err)
		}
	}
	if res.Requests == 0 {
		return res, fmt.Errorf("load: %s: no transaction completed (first error: %s)", name, res.FirstError)
	}
	return res, nil
}
