//go:build istiolab

package istiolab

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKubeletVolumes: the lab's kubelet part. The daemon's istio-ca token and
// istio-cni's agent's service-account token are renewed while they run (the
// renewal shortened from 80% of the lifetime to 2 s here), each a new token
// of the same pod, account, audience and lifetime, swapped in through the
// volume's ..data link; a ConfigMap volume follows its ConfigMap's changes
// (the daemon's istio-ca-root-cert in a root rotation: TestRootRotation).
func TestKubeletVolumes(t *testing.T) {
	cp, lab := startControlPlane(t)
	ctx := t.Context()
	cp.tokenRenewal.Store(int64(2 * time.Second))
	_, z := startMeshNode(t, cp, lab, "node1", ztunnelBinary(t), nil)

	for _, tc := range []struct {
		name, path string
		pod, sa    string
		aud        string // "" for the API server's
		ttl        time.Duration
	}{
		{"ztunnel istio-ca token", filepath.Join(cp.dir(z.Name), tokenFile), z.Name, ZtunnelServiceAccount, "istio-ca", ztunnelTokenTTL},
		{"istio-cni agent token", filepath.Join(nodeDirs{root: cp.dir("node-node1")}.saDir(), "token"), "istio-cni-node-node1", CNIServiceAccount, "", projectedTokenTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, err := os.ReadFile(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			var renewed []byte
			waitUntil(t, 30*time.Second, func() error {
				renewed, err = os.ReadFile(tc.path)
				if err != nil {
					return err
				}
				if bytes.Equal(renewed, first) {
					return errors.New("token not renewed yet")
				}
				return nil
			})
			if target, err := os.Readlink(tc.path); err != nil || !strings.HasPrefix(target, "..data/") {
				t.Errorf("%s is not a link through ..data (%q, %v)", tc.path, target, err)
			}
			c0, c1 := jwtClaims(t, first), jwtClaims(t, renewed)
			if c1.Iat <= c0.Iat && c1.Exp <= c0.Exp {
				t.Errorf("renewed token not newer: iat %d -> %d, exp %d -> %d", c0.Iat, c1.Iat, c0.Exp, c1.Exp)
			}
			if got := time.Duration(c1.Exp-c1.Iat) * time.Second; got != tc.ttl {
				t.Errorf("renewed token lives %v, want %v", got, tc.ttl)
			}
			if c1.Sub != "system:serviceaccount:"+IstioNamespace+":"+tc.sa || c1.Kube.Pod.Name != tc.pod {
				t.Errorf("renewed token is %s bound to pod %q, want %s's pod %s", c1.Sub, c1.Kube.Pod.Name, tc.sa, tc.pod)
			}
			if tc.aud != "" && (len(c1.Aud) != 1 || c1.Aud[0] != tc.aud) {
				t.Errorf("renewed token's audiences %v, want [%s]", c1.Aud, tc.aud)
			}
		})
	}

	t.Run("ConfigMap volume follows its ConfigMap", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "volume")
		cm := func(v string) string {
			return fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kubelet-test\n  namespace: default\ndata:\n  a.pem: %q\n", v)
		}
		if _, err := cp.Kubectl(ctx, cm("one"), "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		defer close(done)
		if err := cp.mountConfigMap(ctx, "default", "kubelet-test", dir, done); err != nil {
			t.Fatal(err)
		}
		read := func(want string) func() error {
			return func() error {
				b, err := os.ReadFile(filepath.Join(dir, "a.pem"))
				if err != nil {
					return err
				}
				if string(b) != want {
					return fmt.Errorf("a.pem holds %q, want %q", b, want)
				}
				return nil
			}
		}
		waitUntil(t, 5*time.Second, read("one"))
		if _, err := cp.Kubectl(ctx, cm("two"), "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 10*time.Second, read("two"))
	})
}

// tokenClaims are a service-account token's claims, the fields checked.
type tokenClaims struct {
	Sub  string   `json:"sub"`
	Aud  []string `json:"aud"`
	Iat  int64    `json:"iat"`
	Exp  int64    `json:"exp"`
	Kube struct {
		Pod struct {
			Name string `json:"name"`
		} `json:"pod"`
	} `json:"kubernetes.io"`
}

// jwtClaims decodes a JWT's payload, unverified (the API server signed it).
func jwtClaims(t *testing.T, token []byte) tokenClaims {
	t.Helper()
	parts := strings.Split(strings.TrimSpace(string(token)), ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %d parts", len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c tokenClaims
	if err := json.Unmarshal(payload, &c); err != nil {
		t.Fatal(err)
	}
	return c
}
