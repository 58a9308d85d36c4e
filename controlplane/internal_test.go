package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
