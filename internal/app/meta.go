package app

import "strings"

// istioMetaPrefix starts the variables whose rest of name and value go into
// the xDS node metadata (ISTIO_META_CLUSTER_ID=x sends CLUSTER_ID=x).
const istioMetaPrefix = "ISTIO_META_"

// proxyMetadata is the metadata ztunnel sends istiod besides its pod's
// name, namespace, IPs and node: base (the proxy config's proxyMetadata),
// overridden by every ISTIO_META_* variable of environ with the prefix cut
// off, as ztunnel merges them. A key that itself starts with ISTIO_META_ in
// base loses the prefix too.
func proxyMetadata(environ []string, base map[string]string) map[string]string {
	meta := make(map[string]string, len(base))
	for k, v := range base {
		meta[strings.TrimPrefix(k, istioMetaPrefix)] = v
	}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if name, ok := strings.CutPrefix(k, istioMetaPrefix); ok && name != "" {
			meta[name] = v
		}
	}
	return meta
}
