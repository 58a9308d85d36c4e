package xdsclient

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRetryDelay(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name      string
		err       error
		backoff   time.Duration
		wantDelay time.Duration
		wantNext  time.Duration
	}{
		{"clean end reconnects at once", nil, 640 * ms, 0, initialBackoff},
		{"connection error doubles", &connError{errors.New("refused")}, 10 * ms, 20 * ms, 20 * ms},
		{"connection error caps", &connError{errors.New("refused")}, 10 * time.Second, maxBackoff, maxBackoff},
		{"unexpected status doubles", status.Error(codes.PermissionDenied, "no"), 40 * ms, 80 * ms, 80 * ms},
		{"unavailable doubles", status.Error(codes.Unavailable, "connection refused"), 40 * ms, 80 * ms, 80 * ms},
		{"unknown resets", status.Error(codes.Unknown, "x"), 5 * time.Second, initialBackoff, initialBackoff},
		{"canceled resets", status.Error(codes.Canceled, "x"), 5 * time.Second, initialBackoff, initialBackoff},
		{"deadline resets", status.Error(codes.DeadlineExceeded, "x"), 5 * time.Second, initialBackoff, initialBackoff},
		{"transport closing resets", status.Error(codes.Unavailable, "transport is closing"), time.Second, initialBackoff, initialBackoff},
		{"goaway resets", status.Error(codes.Unavailable, "received prior goaway: code: NO_ERROR"), time.Second, initialBackoff, initialBackoff},
		{"other error reconnects at once", errors.New("handler failed"), time.Second, 0, initialBackoff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, n := retryDelay(tc.err, tc.backoff)
			if d != tc.wantDelay || n != tc.wantNext {
				t.Errorf("retryDelay = %v, %v; want %v, %v", d, n, tc.wantDelay, tc.wantNext)
			}
		})
	}
}

// TestTerminationReason: each way a stream ends gets ztunnel's reason
// (src/xds/client.rs run_loop), the same cases retryDelay distinguishes.
func TestTerminationReason(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"clean end", nil, TerminationComplete},
		{"connection error", &connError{errors.New("refused")}, TerminationConnectionError},
		{"unexpected status", status.Error(codes.PermissionDenied, "no"), TerminationError},
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), TerminationError},
		{"unknown", status.Error(codes.Unknown, "x"), TerminationReconnect},
		{"canceled", status.Error(codes.Canceled, "x"), TerminationReconnect},
		{"deadline", status.Error(codes.DeadlineExceeded, "x"), TerminationReconnect},
		{"transport closing", status.Error(codes.Unavailable, "transport is closing"), TerminationReconnect},
		{"goaway", status.Error(codes.Unavailable, "received prior goaway: code: NO_ERROR"), TerminationReconnect},
		{"other error", errors.New("handler failed"), TerminationError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := terminationReason(tc.err); got != tc.want {
				t.Errorf("terminationReason(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}
