package labrun

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCountListening(t *testing.T) {
	const procNetTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:3A99 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:3A98 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0200F40A:3A99 0200F40A:1F90 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
   3: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 100 0 0 10 0
`
	for _, tc := range []struct {
		name string
		port uint16
		want int
	}{
		{"listening and an established one on the same port", 15001, 1},
		{"loopback listener", 15000, 1},
		{"an app port", 8080, 1},
		{"nothing there", 15008, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := countListening([]byte(procNetTCP), tc.port); got != tc.want {
				t.Errorf("countListening(%d) = %d, want %d", tc.port, got, tc.want)
			}
		})
	}
}
