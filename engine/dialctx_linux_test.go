package engine

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// lazyCtx is a context whose Done channel is made on demand, as an HBONE
// stream's is (hbone's handlerCtx), and which offers AfterFunc so that
// derived contexts need not ask for it. It counts the Done calls.
type lazyCtx struct {
	deadline time.Time

	mu        sync.Mutex // guards the following fields
	doneCalls int
	done      chan struct{}
	err       error
	after     map[*func()]bool
}

func (c *lazyCtx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }
func (c *lazyCtx) Value(any) any               { return nil }

func (c *lazyCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.doneCalls++
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

func (c *lazyCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *lazyCtx) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	if c.after == nil {
		c.after = map[*func()]bool{}
	}
	e := &f
	c.after[e] = true
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.after[e] {
			return false
		}
		delete(c.after, e)
		return true
	}
}

func (c *lazyCtx) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = context.Canceled
	if c.done != nil {
		close(c.done)
	}
	for f := range c.after {
		go (*f)()
	}
	c.after = nil
}

// state returns the Done calls made and the AfterFunc callbacks pending.
func (c *lazyCtx) state() (doneCalls, pending int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.doneCalls, len(c.after)
}

// TestDialLazyDoneContext: Dial never asks a context with AfterFunc for its
// Done channel (an idle HBONE stream would keep the channel for its whole
// life), leaves no callback registered once over, and still ends when that
// context is cancelled or its deadline passes.
func TestDialLazyDoneContext(t *testing.T) {
	d := &Dialer{}
	check := func(t *testing.T, ctx *lazyCtx) {
		t.Helper()
		if calls, pending := ctx.state(); calls != 0 || pending != 0 {
			t.Errorf("after Dial: %d Done calls, %d AfterFunc callbacks pending; want 0, 0", calls, pending)
		}
	}
	t.Run("connects", func(t *testing.T) {
		ln, err := Listen(context.Background(), "127.0.0.1:0", SocketOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ctx := &lazyCtx{}
		c, err := d.Dial(ctx, netip.Addr{}, ln.Addr().(*net.TCPAddr).AddrPort())
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		check(t, ctx)
	})
	// hangs dials a stalled listener under the context newCtx makes and
	// checks that the dial ends soon after that context does (100ms after
	// it is made), with an error that is want.
	hangs := func(t *testing.T, newCtx func() *lazyCtx, want func(error) bool) {
		t.Helper()
		dst := stalledListener(t)
		start := time.Now()
		ctx := newCtx()
		c, err := d.Dial(ctx, netip.Addr{}, dst)
		if err == nil {
			c.Close()
			t.Fatal("connect to a stalled listener succeeded")
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("Dial returned %v after start, want soon after the context ends at 100ms", el)
		}
		if !want(err) {
			t.Errorf("unexpected error %v", err)
		}
		check(t, ctx)
	}
	t.Run("cancel aborts the connect", func(t *testing.T) {
		hangs(t, func() *lazyCtx {
			ctx := &lazyCtx{}
			time.AfterFunc(100*time.Millisecond, ctx.cancel)
			return ctx
		}, func(err error) bool { return errors.Is(err, context.Canceled) })
	})
	t.Run("deadline bounds the connect", func(t *testing.T) {
		hangs(t, func() *lazyCtx {
			return &lazyCtx{deadline: time.Now().Add(100 * time.Millisecond)}
		}, func(err error) bool {
			ne, ok := err.(net.Error)
			return ok && ne.Timeout()
		})
	})
	t.Run("already cancelled", func(t *testing.T) {
		ctx := &lazyCtx{}
		ctx.cancel()
		c, err := d.Dial(ctx, netip.Addr{}, netip.MustParseAddrPort("127.0.0.1:9"))
		if err == nil {
			c.Close()
			t.Fatal("dial under a cancelled context succeeded")
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	})
}
