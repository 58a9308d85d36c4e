package hbone

import (
	"context"
	"errors"
	"testing"
	"time"
)

type handlerCtxKey struct{}

// TestHandlerCtx checks the stream handler's context against what
// context.WithCancel of the connection's context gave: values and deadline
// of the connection, cancellation reaching derived contexts, and no
// callback kept once the derived contexts end.
func TestHandlerCtx(t *testing.T) {
	deadline := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, h *handlerCtx)
	}{
		{"values and deadline of the connection", func(t *testing.T, h *handlerCtx) {
			if v := h.Value(handlerCtxKey{}); v != "conn" {
				t.Fatalf("Value = %v", v)
			}
			if d, ok := h.Deadline(); !ok || !d.Equal(deadline) {
				t.Fatalf("Deadline = %v %v", d, ok)
			}
		}},
		{"cancel reaches a derived context", func(t *testing.T, h *handlerCtx) {
			d, cancel := context.WithTimeout(h, time.Hour)
			defer cancel()
			if d.Err() != nil || h.Err() != nil {
				t.Fatal("done before cancel")
			}
			h.cancel()
			<-d.Done()
			<-h.Done()
			if !errors.Is(d.Err(), context.Canceled) || !errors.Is(h.Err(), context.Canceled) {
				t.Fatalf("Err = %v, %v", d.Err(), h.Err())
			}
			if c := context.Cause(h); !errors.Is(c, context.Canceled) {
				t.Fatalf("Cause = %v", c)
			}
		}},
		{"an ended derived context leaves nothing", func(t *testing.T, h *handlerCtx) {
			d1, cancel1 := context.WithCancel(h)
			stop := context.AfterFunc(h, func() { t.Error("stopped callback ran") })
			d2, cancel2 := context.WithTimeout(h, time.Hour)
			if n := len(h.after); n != 3 {
				t.Fatalf("%d callbacks, want 3", n)
			}
			cancel1()
			cancel2()
			if !stop() {
				t.Fatal("stop found nothing to stop")
			}
			if h.after != nil || d1.Err() == nil || d2.Err() == nil {
				t.Fatalf("after the derived contexts ended: %d callbacks kept", len(h.after))
			}
			h.cancel()
		}},
		{"derived after cancel is done at once", func(t *testing.T, h *handlerCtx) {
			h.cancel()
			h.cancel() // idempotent
			d, cancel := context.WithCancel(h)
			defer cancel()
			<-d.Done()
			ran := make(chan struct{})
			if context.AfterFunc(h, func() { close(ran) })() {
				t.Fatal("stop stopped a callback of a cancelled context")
			}
			<-ran
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			connCtx, cancel := context.WithDeadline(context.WithValue(context.Background(), handlerCtxKey{}, "conn"), deadline)
			defer cancel()
			tc.run(t, &handlerCtx{c: &conn{ctx: connCtx, vals: context.WithoutCancel(connCtx)}})
		})
	}
}
