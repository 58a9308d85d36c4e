package istiolab

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
)

// ZtunnelCRLFile is where the ztunnel chart mounts the istio-ca-crl ConfigMap
// when peerCaCrl.enabled (/var/run/secrets/istio/crl/ca-crl.pem, its
// CRL_PATH), relative to the daemon's working directory as the lab's other
// mounts are: a daemon started with ZtunnelCRLEnv reads it there.
const ZtunnelCRLFile = "var/run/secrets/istio/crl/ca-crl.pem"

// ZtunnelCRLEnv is the chart's CRL_PATH under peerCaCrl.enabled, moved under
// the daemon's working directory (ZtunnelCRLFile), for ZtunnelOptions.Env.
const ZtunnelCRLEnv = "CRL_PATH=" + ZtunnelCRLFile

// crlConfigMap is the ConfigMap istiod's namespace controller writes into
// every namespace from a plugged CA's ca-crl.pem (PILOT_CRL_CONFIGMAP's
// default), key ca-crl.pem.
const crlConfigMap = "istio-ca-crl"

// CRL returns the revocation lists istiod published in namespace (its
// istio-ca-crl ConfigMap); empty if it has written none.
func (cp *ControlPlane) CRL(ctx context.Context, namespace string) ([]byte, error) {
	return cp.Kubectl(ctx, "", "get", "configmap", crlConfigMap, "-n", namespace,
		"-o", `jsonpath={.data.ca-crl\.pem}`, "--ignore-not-found")
}

// SyncZtunnelCRL does the kubelet's part of a CRL change for the daemon pod
// name (a Ztunnel's Name; ZtunnelOptions.Name's default is "ztunnel-<node>"):
// it writes istio-ca-crl's current content in IstioNamespace into the
// daemon's mounted CRL file (ZtunnelCRLFile), swapped in as a ConfigMap
// volume is updated, which a running daemon reloads by itself. Called before
// the daemon starts, it is the volume's mount at the pod's start. It fails
// if istiod has published no CRL.
func (cp *ControlPlane) SyncZtunnelCRL(ctx context.Context, name string) error {
	crl, err := cp.CRL(ctx, IstioNamespace)
	if err != nil {
		return err
	}
	if !strings.Contains(string(crl), "BEGIN X509 CRL") {
		return fmt.Errorf("istiolab: no CRL in %s/%s", IstioNamespace, crlConfigMap)
	}
	return writeVolume(filepath.Dir(filepath.Join(cp.dir(name), ZtunnelCRLFile)), map[string][]byte{filepath.Base(ZtunnelCRLFile): crl})
}
