package mtls

import (
	"testing"
	"time"
)

func TestRetryDelay(t *testing.T) {
	base := time.Second
	for failures := range 40 {
		lo, hi := time.Duration(float64(base)*0.8), min(time.Duration(float64(base)*1.2), retryMax)
		lo = min(lo, retryMax)
		for range 50 {
			if d := retryDelay(failures); d < lo || d > hi {
				t.Fatalf("retryDelay(%d) = %v, want within [%v, %v]", failures, d, lo, hi)
			}
		}
		base = min(2*base, retryMax)
	}
}
