package istiolab

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"
)

// A kubelet's part for the volumes the lab's components mount: projected
// service-account tokens, requested from the TokenRequest API and renewed
// at 80% of their lifetime, and a ConfigMap volume kept in step with its
// ConfigMap. Each volume is written as the kubelet's atomic writer writes
// it (writeVolume: a new ..data directory swapped in by a rename), so a
// reader never sees half of an update.

// projectedTokenTTL is the kubelet's default lifetime of a projected
// service-account token (the API server's audience).
const projectedTokenTTL = time.Hour

// configMapSyncPeriod is how often the lab compares a mounted ConfigMap
// with the API's. A kubelet takes up to its sync period plus its cache's
// TTL (about a minute by default); the lab is quicker, never slower.
const configMapSyncPeriod = time.Second

// tokenVolume is a projected volume holding a service-account token (and,
// for the API server's own audience, its CA and the namespace).
type tokenVolume struct {
	// dir is the volume's directory.
	dir string
	// files are the volume's files for a token.
	files func(token string) map[string][]byte
	// namespace and serviceAccount name the account; audiences are the
	// token's (nil: the API server's).
	namespace, serviceAccount string
	audiences                 []string
	// ttl is the token's expirationSeconds.
	ttl time.Duration
	// bound, if not nil, is the pod the token is bound to.
	bound *boundObjectRef
	// until ends the renewal: the pod's process exited. Nil: when the
	// control plane closes.
	until <-chan struct{}
}

// renewAfter is when a kubelet renews a token of lifetime ttl: at 80% of
// it. Tests shorten it (ControlPlane.tokenRenewal).
func (cp *ControlPlane) renewAfter(ttl time.Duration) time.Duration {
	if d := time.Duration(cp.tokenRenewal.Load()); d != 0 {
		return d
	}
	return ttl * 4 / 5
}

// mountToken writes v's token and renews it until v.until closes or the
// control plane closes. A later call for the same directory (the component
// restarted, a new pod) ends the earlier renewal.
func (cp *ControlPlane) mountToken(ctx context.Context, v tokenVolume) error {
	write := func(ctx context.Context) error {
		token, err := cp.api.serviceAccountToken(ctx, v.namespace, v.serviceAccount, v.audiences, v.ttl, v.bound)
		if err != nil {
			return err
		}
		return writeVolume(v.dir, v.files(token))
	}
	if err := write(ctx); err != nil {
		return err
	}
	stop := make(chan struct{})
	cp.mu.Lock()
	if cp.tokenVolumes == nil {
		cp.tokenVolumes = make(map[string]chan struct{})
	}
	if old, ok := cp.tokenVolumes[v.dir]; ok {
		close(old)
	}
	cp.tokenVolumes[v.dir] = stop
	cp.mu.Unlock()
	cp.bgDone.Go(func() {
		defer func() {
			cp.mu.Lock()
			if cp.tokenVolumes[v.dir] == stop {
				delete(cp.tokenVolumes, v.dir)
			}
			cp.mu.Unlock()
		}()
		renew := cp.renewAfter(v.ttl)
		for {
			t := time.NewTimer(renew)
			select {
			case <-cp.bg.Done():
			case <-v.until:
			case <-stop:
			case <-t.C:
			}
			t.Stop()
			select {
			case <-cp.bg.Done():
				return
			case <-v.until:
				return
			case <-stop:
				return
			default:
			}
			renew = cp.renewAfter(v.ttl)
			if err := write(cp.bg); err != nil && cp.bg.Err() == nil {
				cp.cfg.Logf("istiolab: renewing the token of %s/%s in %s: %v", v.namespace, v.serviceAccount, v.dir, err)
				renew = min(renew, 10*time.Second)
			}
		}
	})
	return nil
}

// configMap is a v1 ConfigMap, the fields used.
type configMap struct {
	Data map[string]string `json:"data"`
}

// mountConfigMap writes ConfigMap namespace/name into dir (one file per
// key) and keeps it in step with the API until until closes or the control
// plane closes, as the kubelet syncs a ConfigMap volume: each change is one
// atomic swap of the volume.
func (cp *ControlPlane) mountConfigMap(ctx context.Context, namespace, name, dir string, until <-chan struct{}) error {
	path := fmt.Sprintf("/api/v1/namespaces/%s/configmaps/%s", namespace, name)
	var last map[string][]byte
	sync := func(ctx context.Context) error {
		var cm configMap
		if err := cp.api.do(ctx, http.MethodGet, path, nil, &cm); err != nil {
			return err
		}
		files := make(map[string][]byte, len(cm.Data))
		changed := len(cm.Data) != len(last)
		for k, v := range cm.Data {
			files[k] = []byte(v)
			changed = changed || !bytes.Equal(last[k], files[k])
		}
		if !changed {
			return nil
		}
		if err := writeVolume(dir, files); err != nil {
			return err
		}
		last = files
		return nil
	}
	if err := sync(ctx); err != nil {
		return err
	}
	cp.bgDone.Go(func() {
		tick := time.NewTicker(configMapSyncPeriod)
		defer tick.Stop()
		for {
			select {
			case <-cp.bg.Done():
				return
			case <-until:
				return
			case <-tick.C:
			}
			if err := sync(cp.bg); err != nil && cp.bg.Err() == nil {
				cp.cfg.Logf("istiolab: syncing ConfigMap %s/%s into %s: %v", namespace, name, dir, err)
			}
		}
	})
	return nil
}
