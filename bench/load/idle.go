package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// IdleConfig configures an idle run: open Count connections in Steps,
// sampling the watched processes before the first and after each step.
type IdleConfig struct {
	Dialer *Dialer
	// Count is the number of connections to hold. Required, at most
	// MaxIdleConns.
	Count int
	// Steps splits the ramp; the result has Steps+1 samples. Default 1.
	Steps int
	// Concurrency is how many dials run in parallel. Default 32.
	Concurrency int
	// Pids are the processes to sample (the proxy under test).
	Pids []int
	// GoroutineURLs are pprof goroutine endpoints (debug=1) to sample.
	GoroutineURLs []string
	// Settle is the pause before each sample, so the processes finish
	// reacting to the step. Default 300ms.
	Settle time.Duration
	// FinalSettle, if longer than Settle, replaces it before the last
	// sample only: the final reading can then be taken as long after the
	// connections opened as a goal asks (issue 23's idle RSS is read 30 s
	// after they opened, once the daemon has returned what the burst of
	// set-ups freed), without stretching every step of the ramp.
	FinalSettle time.Duration
	// Hold keeps the connections open after the last sample, for outside
	// measurements; OnHold is called when it starts. At most MaxDuration.
	Hold   time.Duration
	OnHold func(conns int)
	// Raw sends no header: each connection sends one byte and expects it
	// echoed. Otherwise each does one 1-byte exchange in RR mode, so every
	// hop of the path is known to be established before it goes idle.
	Raw bool
	// Progress, if set, receives a status line about once a second.
	Progress func(string)
}

// Idle runs the idle mode. Connections are closed before it returns.
func Idle(ctx context.Context, cfg IdleConfig) (*IdleResult, error) {
	if cfg.Dialer == nil {
		return nil, errors.New("load: no dialer")
	}
	if cfg.Count <= 0 || cfg.Count > MaxIdleConns {
		return nil, fmt.Errorf("load: idle count %d outside (0, %d]", cfg.Count, MaxIdleConns)
	}
	if cfg.Steps <= 0 {
		cfg.Steps = 1
	}
	cfg.Steps = min(cfg.Steps, cfg.Count)
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 300 * time.Millisecond
	}
	if cfg.FinalSettle < 0 || cfg.FinalSettle > MaxDuration {
		return nil, fmt.Errorf("load: final settle %v outside [0, %v]", cfg.FinalSettle, MaxDuration)
	}
	cfg.FinalSettle = max(cfg.FinalSettle, cfg.Settle)
	if cfg.Hold < 0 || cfg.Hold > MaxDuration {
		return nil, fmt.Errorf("load: hold %v outside [0, %v]", cfg.Hold, MaxDuration)
	}
	var (
		mu    sync.Mutex // guards conns
		conns []Conn
	)
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	stopProgress := progress(ctx, cfg.Progress, func(elapsed time.Duration) string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("idle %5.1fs  %d connections open", elapsed.Seconds(), len(conns))
	})
	defer stopProgress()

	res := &IdleResult{}
	sample := func(n int, settle time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(settle):
		}
		s := IdleSample{Conns: n, Settle: settle}
		for _, pid := range cfg.Pids {
			ps, err := ReadProc(pid)
			if err != nil {
				return err
			}
			s.Procs = append(s.Procs, ps)
		}
		for _, u := range cfg.GoroutineURLs {
			gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			g, err := FetchGoroutines(gctx, nil, u)
			cancel()
			if err != nil {
				g = -1
			}
			s.Goroutines = append(s.Goroutines, g)
		}
		res.Samples = append(res.Samples, s)
		return nil
	}
	if err := sample(0, cfg.Settle); err != nil {
		return nil, err
	}
	open := func(ctx context.Context) (Conn, error) {
		c, err := cfg.Dialer.Dial(ctx)
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(cfg.Dialer.cfg.Timeout))
		msg := []byte{0}
		if !cfg.Raw {
			h := Header{Op: OpRR, Req: 1, Resp: 1}.Marshal()
			msg = append(h[:], 0)
		}
		var b [1]byte
		_, err = c.Write(msg)
		if err == nil {
			_, err = io.ReadFull(c, b[:])
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		_ = c.SetDeadline(time.Time{})
		return c, nil
	}
	opened := 0
	for step := 1; step <= cfg.Steps; step++ {
		target := cfg.Count * step / cfg.Steps
		if err := openN(ctx, target-opened, cfg.Concurrency, open, func(c Conn) {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}); err != nil {
			return nil, fmt.Errorf("load: idle: after %d connections: %w", opened, err)
		}
		opened = target
		settle := cfg.Settle
		if step == cfg.Steps {
			settle = cfg.FinalSettle
		}
		if err := sample(opened, settle); err != nil {
			return nil, err
		}
	}
	res.Connections = opened
	first, last := res.Samples[0], res.Samples[len(res.Samples)-1]
	for i := range first.Procs {
		res.PerConn = append(res.PerConn, PerConn{
			Pid:    first.Procs[i].Pid,
			RSSKiB: float64(last.Procs[i].RSSKiB-first.Procs[i].RSSKiB) / float64(opened),
			FDs:    float64(last.Procs[i].FDs-first.Procs[i].FDs) / float64(opened),
		})
	}
	for i := range first.Goroutines {
		g := -1.0
		if first.Goroutines[i] >= 0 && last.Goroutines[i] >= 0 {
			g = float64(last.Goroutines[i]-first.Goroutines[i]) / float64(opened)
		}
		res.GoroutinesPerConn = append(res.GoroutinesPerConn, g)
	}
	if cfg.Hold > 0 {
		if cfg.OnHold != nil {
			cfg.OnHold(opened)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(cfg.Hold):
		}
	}
	return res, nil
}

// openN opens n connections with up to par dials in flight and hands each
// to keep. It stops at the first error.
func openN(ctx context.Context, n, par int, open func(context.Context) (Conn, error), keep func(Conn)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan struct{})
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range min(par, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				c, err := open(ctx)
				if err != nil {
					once.Do(func() { firstErr = err; cancel() })
					continue
				}
				keep(c)
			}
		}()
	}
	for range n {
		select {
		case jobs <- struct{}{}:
			continue
		case <-ctx.Done():
		}
		break
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
