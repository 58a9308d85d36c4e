package app

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

// FuzzParseEnv feeds environments, one KEY=value per line, to ParseEnv.
// Whatever it accepts is within the documented ranges (windows, frame
// size, stream limit, CPU quantities, loopback admin address, known modes
// and engines); whatever it refuses is reported variable by variable.
func FuzzParseEnv(f *testing.F) {
	for _, env := range []string{
		"",
		"PROXY_MODE=dedicated\nPROXY_WORKLOAD_INFO=ns1/pod1/sa1\nLOCAL_XDS_PATH=/x.yaml",
		"POD_NAME=ztunnel-abc\nPOD_NAMESPACE=istio-system\nSERVICE_ACCOUNT=ztunnel\nINSTANCE_IP=10.0.0.9\nZTUNNEL_CPU_LIMIT=500m\nZTUNNEL_RESOURCE_CPU_REQUEST=2\nINPOD_ENABLED=true\nISTIO_META_ISTIO_VERSION=1.27.0",
		"HTTP2_STREAM_WINDOW_SIZE=1\nHTTP2_FRAME_SIZE=16384\nPOOL_MAX_STREAMS_PER_CONNECTION=65535\nKEEPALIVE_RETRIES=255\nKEEPALIVE_TIME=1m30s\nSECRET_TTL=3600",
		"TERMINATION_GRACE_PERIOD_SECONDS=30\nENABLE_ORIG_SRC=false\nPACKET_MARK=4294967295\nZTUNNEL_ENGINE=uring\nRUST_LOG=info,access=debug\nLOG_FORMAT=json",
		"ZTUNNEL_ADMIN_ADDR=[::1]:15000\nTRUST_DOMAIN=example.org\nXDS_ADDRESS=istiod:15012\nCA_ADDRESS=https://ca:15012\nFAKE_CA=true",
		"PROXY_MODE=other\nINSTANCE_IP=node-a\nZTUNNEL_CPU_LIMIT=-1\nCRL_PATH=/etc/crl.pem\nKEEPALIVE_TIME=-5s\nZTUNNEL_ADMIN_ADDR=0.0.0.0:15000",
		"ZTUNNEL_FD_BUDGET=5000\nZTUNNEL_MEMORY_RELEASE_INTERVAL=0",
	} {
		fuzzseed.Add(f, env)
	}
	f.Fuzz(func(t *testing.T, environ string) {
		vars := map[string]string{}
		for line := range strings.SplitSeq(environ, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				vars[k] = v
			}
		}
		c, err := ParseEnv(lookupFrom(vars))
		if err != nil {
			var joined interface{ Unwrap() []error }
			if !errors.As(err, &joined) {
				t.Fatalf("error is not a list of variables: %v", err)
			}
			for _, e := range joined.Unwrap() {
				var ee *envError
				if !errors.As(e, &ee) || ee.name == "" {
					t.Fatalf("error names no variable: %v", e)
				}
			}
			return
		}
		for _, check := range []struct {
			what string
			ok   bool
		}{
			{"mode", c.Mode == ModeShared || c.Mode == ModeDedicated},
			{"stream window", c.StreamWindow >= 1 && c.StreamWindow <= math.MaxInt32},
			{"connection window", c.ConnectionWindow >= 1 && c.ConnectionWindow <= math.MaxInt32},
			{"frame size", c.FrameSize >= 16384 && c.FrameSize < 1<<24},
			{"pool streams", c.PoolMaxStreams >= 1 && c.PoolMaxStreams <= math.MaxUint16},
			{"keepalive retries", c.KeepAliveRetries >= 1 && c.KeepAliveRetries <= 255},
			{"durations", c.SecretTTL >= 0 && c.PoolUnusedRelease >= 0 && c.KeepAliveTime >= 0 && c.KeepAliveInterval >= 0 && c.TerminationDeadline >= 0},
			{"cpu", finiteNonNegative(c.CPULimit) && finiteNonNegative(c.CPURequest)},
			{"trust domain", c.TrustDomain != "" && !strings.ContainsAny(c.TrustDomain, "/ ")},
			{"admin address", checkAdminAddr(c.AdminAddr) == nil},
			{"log format", c.LogFormat == "plain" || c.LogFormat == "json"},
			{"descriptor budget", c.FDBudget == "auto" || c.FDBudget == "off" || positiveInt(c.FDBudget)},
		} {
			if !check.ok {
				t.Fatalf("accepted %s out of range: %+v", check.what, c)
			}
		}
	})
}

func finiteNonNegative(f float64) bool { return f >= 0 && !math.IsInf(f, 0) }

func positiveInt(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n > 0
}
