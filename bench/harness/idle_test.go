package harness

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestIdleDefaults checks the idle ramp's defaults: a full run opens
// defaultIdleConns connections (which every HAProxy must accept; issue 23's
// 5,000 too, asked for with --idle-conns) and reads the
// last step 30 s after it opened, a quick run 100 read after 1 s so CI stays
// fast, and a setting given is kept.
func TestIdleDefaults(t *testing.T) {
	bin := t.TempDir()
	for _, n := range []string{"ztunnel", "zload", "zpeer"} {
		if err := os.WriteFile(filepath.Join(bin, n), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		o      Options
		settle time.Duration
		conns  int
	}{
		{Options{}, 30 * time.Second, defaultIdleConns},
		{Options{Quick: true}, time.Second, 100},
		{Options{IdleSettle: 5 * time.Second, IdleConns: 300}, 5 * time.Second, 300},
	} {
		o := c.o
		o.OutDir, o.HAProxy = t.TempDir(), "-"
		o.Ztunnel, o.Zload, o.Zpeer = filepath.Join(bin, "ztunnel"), filepath.Join(bin, "zload"), filepath.Join(bin, "zpeer")
		if err := o.defaults(); err != nil {
			t.Fatal(err)
		}
		if o.IdleSettle != c.settle || o.IdleConns != c.conns || o.IdleConns > haproxyMaxConn {
			t.Errorf("quick %v: idle settle %v, %d connections; want %v, %d", c.o.Quick, o.IdleSettle, o.IdleConns, c.settle, c.conns)
		}
	}
}
