package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

func TestRootFileIsReReadWhenItChanges(t *testing.T) {
	a, b := xdstest.NewTLS(t), xdstest.NewTLS(t)
	path := filepath.Join(t.TempDir(), "root.pem")
	if err := os.WriteFile(path, a.RootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	r := &rootSource{spec: path}
	p1, err := r.pool()
	if err != nil {
		t.Fatal(err)
	}
	if p2, _ := r.pool(); p2 != p1 {
		t.Error("unchanged file was parsed again")
	}
	if err := os.WriteFile(path, append(b.RootPEM, a.RootPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, time.Now(), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	p3, err := r.pool()
	if err != nil || p3 == p1 || p3.Equal(p1) {
		t.Errorf("changed file not re-read (err %v)", err)
	}
}

func TestCallCredentials(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &callCreds{tokenPath: tok, clusterID: "c1", headers: map[string]string{"authorization": "spoofed", "x": "y"}}
	md, err := c.GetRequestMetadata(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if md["authorization"] != "Bearer abc" || md["clusterid"] != "c1" || md["x"] != "y" {
		t.Errorf("metadata %v", md)
	}
	if err := os.WriteFile(tok, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetRequestMetadata(context.Background()); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty token file: %v", err)
	}
	static := &callCreds{token: "s", clusterID: "c2"}
	if md, _ := static.GetRequestMetadata(context.Background()); md["authorization"] != "Bearer s" || md["clusterid"] != "c2" {
		t.Errorf("static token metadata %v", md)
	}
	none := &callCreds{clusterID: "c3"}
	if md, _ := none.GetRequestMetadata(context.Background()); len(md) != 0 {
		t.Errorf("no token, metadata %v", md)
	}
}
