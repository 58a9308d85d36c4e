package load

import (
	"errors"
	"fmt"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Limits every run is held to, so that no flag combination runs unbounded.
const (
	MaxDuration    = time.Hour
	MaxCount       = 100_000_000
	MaxConcurrency = 10_000
	MaxIdleConns   = 200_000
	MaxWriteSize   = 16 << 20
	MaxRate        = 10_000_000
)

// ErrUnbounded reports a run with neither a duration nor a count.
var ErrUnbounded = errors.New("load: a duration or a count is required")

// Bounds limits a run: it stops at the first of Duration and Count that is
// set. At least one must be.
type Bounds struct {
	Duration time.Duration `json:"duration_ns,omitempty"`
	Count    int64         `json:"count,omitempty"`
}

// Validate checks the bounds against the maximums.
func (b Bounds) Validate() error {
	if b.Duration <= 0 && b.Count <= 0 {
		return ErrUnbounded
	}
	if b.Duration < 0 || b.Duration > MaxDuration {
		return fmt.Errorf("load: duration %v outside (0, %v]", b.Duration, MaxDuration)
	}
	if b.Count < 0 || b.Count > MaxCount {
		return fmt.Errorf("load: count %d outside (0, %d]", b.Count, MaxCount)
	}
	return nil
}

// Result is what a run reports (zload --json prints it).
type Result struct {
	Mode       string            `json:"mode"`
	Target     string            `json:"target"`
	Started    time.Time         `json:"started"`
	Throughput *ThroughputResult `json:"throughput,omitempty"`
	RR         *RRResult         `json:"rr,omitempty"`
	CPS        *RRResult         `json:"cps,omitempty"`
	Idle       *IdleResult       `json:"idle,omitempty"`
}

// ThroughputResult is the outcome of a throughput run.
type ThroughputResult struct {
	Streams int `json:"streams"`
	// Bytes is the total the server acknowledged (or, in Raw mode, that the
	// client wrote).
	Bytes int64 `json:"bytes"`
	// Seconds is from the first stream's start to the last stream's
	// acknowledgement.
	Seconds float64 `json:"seconds"`
	// Gbps is Bytes*8/Seconds/1e9.
	Gbps float64 `json:"gbps"`
	// StreamGbps is each stream's own rate.
	StreamGbps []float64 `json:"stream_gbps"`
	// AckWait is the longest wait of a stream, after it stopped writing,
	// for the server's count: the time to drain what the path buffered.
	AckWait float64 `json:"ack_wait_seconds"`
	// Acked is false in Raw mode, where bytes are counted as written.
	Acked bool `json:"acked"`
}

// Latency summarises a histogram, in microseconds.
type Latency struct {
	P50  float64 `json:"p50_us"`
	P90  float64 `json:"p90_us"`
	P99  float64 `json:"p99_us"`
	P999 float64 `json:"p99_9_us"`
	Max  float64 `json:"max_us"`
	Mean float64 `json:"mean_us"`
}

// RRResult is the outcome of a request/response or connection-rate run.
type RRResult struct {
	Concurrency int `json:"concurrency"`
	ReqSize     int `json:"req_size"`
	RespSize    int `json:"resp_size"`
	// Rate is the requested rate per second (0: closed loop).
	Rate float64 `json:"rate,omitempty"`
	// Requests counts completed transactions (connections in cps mode).
	Requests int64 `json:"requests"`
	Errors   int64 `json:"errors"`
	// FirstError is the first error seen, for diagnosis.
	FirstError string  `json:"first_error,omitempty"`
	Seconds    float64 `json:"seconds"`
	// PerSecond is Requests/Seconds.
	PerSecond float64 `json:"per_second"`
	// The fields below are set by open-loop runs (RRConfig.OpenRate) only.
	// OpenRate is the requested rate. Seconds then runs from the first
	// scheduled request to the last response (or failure).
	OpenRate float64 `json:"open_rate,omitempty"`
	// Sent counts requests written.
	Sent int64 `json:"sent,omitempty"`
	// Missed counts scheduled requests not sent: the schedule ended (or the
	// connection failed) while the writer was held up by MaxInFlight
	// unanswered requests or a full socket.
	Missed int64 `json:"missed,omitempty"`
	// Unanswered counts requests sent that got no (or a wrong) response.
	Unanswered int64 `json:"unanswered,omitempty"`
	// SendLag is how late the requests went out after their scheduled time:
	// the generator's own lateness (or back-pressure), part of Latency.
	SendLag *Latency `json:"send_lag,omitempty"`
	Latency Latency  `json:"latency"`
}

// ProcStat is a snapshot of a process from /proc.
type ProcStat struct {
	Pid int `json:"pid"`
	// RSSKiB is VmRSS.
	RSSKiB int64 `json:"rss_kib"`
	// FDs counts the entries of /proc/<pid>/fd.
	FDs int `json:"fds"`
	// Threads is the process's thread count.
	Threads int `json:"threads"`
	// CPUTicks is utime+stime in clock ticks (USER_HZ, 100 on Linux).
	CPUTicks int64 `json:"cpu_ticks"`
}

// IdleSample is the state of the watched processes with Conns connections
// open.
type IdleSample struct {
	Conns int        `json:"conns"`
	Procs []ProcStat `json:"procs,omitempty"`
	// Goroutines holds the count from each GoroutineURLs entry (-1 when the
	// fetch failed).
	Goroutines []int `json:"goroutines,omitempty"`
	// Settle is the pause before the sample, after its step's connections
	// opened: a reading's age, which a goal may set (IdleConfig.FinalSettle).
	Settle time.Duration `json:"settle_ns,omitempty"`
}

// IdleResult is the outcome of an idle run: samples from 0 connections (the
// baseline) up to Connections.
type IdleResult struct {
	Connections int          `json:"connections"`
	Samples     []IdleSample `json:"samples"`
	// PerConn is, for each watched pid, (last - baseline) / Connections.
	PerConn []PerConn `json:"per_conn,omitempty"`
	// GoroutinesPerConn is the same for each goroutine URL.
	GoroutinesPerConn []float64 `json:"goroutines_per_conn,omitempty"`
}

// PerConn is the cost of one idle connection to one process.
type PerConn struct {
	Pid    int     `json:"pid"`
	RSSKiB float64 `json:"rss_kib"`
	FDs    float64 `json:"fds"`
}

func summarize(h *hdrhistogram.Histogram) Latency {
	if h.TotalCount() == 0 {
		return Latency{}
	}
	return Latency{
		P50:  float64(h.ValueAtQuantile(50)),
		P90:  float64(h.ValueAtQuantile(90)),
		P99:  float64(h.ValueAtQuantile(99)),
		P999: float64(h.ValueAtQuantile(99.9)),
		Max:  float64(h.Max()),
		Mean: h.Mean(),
	}
}

// newHistogram records microseconds from 1 µs to 60 s with 3 significant
// digits.
func newHistogram() *hdrhistogram.Histogram { return hdrhistogram.New(1, 60_000_000, 3) }
