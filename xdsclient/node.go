package xdsclient

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// DefaultInstanceIP is the instance IP ztunnel reports when INSTANCE_IP is
// unset.
const DefaultInstanceIP = "1.1.1.1"

// NodeInfo is what goes into the xDS node, from ztunnel's environment.
type NodeInfo struct {
	// InstanceIP is INSTANCE_IP, used verbatim (NodeInfoFromEnv fills
	// DefaultInstanceIP when the variable is unset).
	InstanceIP string
	// PodName, PodNamespace and NodeName are POD_NAME, POD_NAMESPACE and
	// NODE_NAME.
	PodName, PodNamespace, NodeName string
	// ProxyMetadata is the proxy metadata: ProxyConfig proxyMetadata and the
	// ISTIO_META_* variables with the prefix removed. Values are strings.
	ProxyMetadata map[string]string
	// MetaJSON holds the ISTIO_METAJSON_* variables with the prefix removed;
	// each value is a JSON document that becomes a structured metadata value.
	MetaJSON map[string]string
}

// NodeInfoFromEnv reads the variables NewNode needs from environ ("KEY=value"
// entries as os.Environ returns them), applying ztunnel's defaults.
// proxyMetadata is the already merged proxy metadata (it is owned by the
// daemon's configuration, which also reads ProxyConfig).
func NodeInfoFromEnv(environ []string, proxyMetadata map[string]string) NodeInfo {
	info := NodeInfo{InstanceIP: DefaultInstanceIP, ProxyMetadata: proxyMetadata, MetaJSON: map[string]string{}}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "INSTANCE_IP":
			info.InstanceIP = v
		case "POD_NAME":
			info.PodName = v
		case "POD_NAMESPACE":
			info.PodNamespace = v
		case "NODE_NAME":
			info.NodeName = v
		default:
			if name, ok := strings.CutPrefix(k, "ISTIO_METAJSON_"); ok {
				info.MetaJSON[name] = v
			}
		}
	}
	return info
}

// NewNode builds the node ztunnel sends in its initial requests: ID
// "ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local" and metadata NAME,
// NAMESPACE, INSTANCE_IPS and NODE_NAME, overridden by the proxy metadata,
// overridden in turn by the ISTIO_METAJSON_* values. A MetaJSON value that is
// not valid JSON is left out and reported in skipped, as ztunnel logs and
// skips it. So is any name or value that is not UTF-8 (ztunnel cannot read
// such a variable either): protobuf refuses to encode it, and one such field
// would fail every request of the stream (found by FuzzNewNode).
func NewNode(info NodeInfo) (node *corev3.Node, skipped []error) {
	fields := map[string]*structpb.Value{}
	set := func(what, k, v string) {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			skipped = append(skipped, fmt.Errorf("xdsclient: %s %q: not UTF-8", what, k))
			return
		}
		fields[k] = structpb.NewStringValue(v)
	}
	set("metadata", "NAME", info.PodName)
	set("metadata", "NAMESPACE", info.PodNamespace)
	set("metadata", "INSTANCE_IPS", info.InstanceIP)
	set("metadata", "NODE_NAME", info.NodeName)
	for k, v := range info.ProxyMetadata {
		set("proxy metadata", k, v)
	}
	for _, k := range slices.Sorted(maps.Keys(info.MetaJSON)) {
		var doc any
		if !utf8.ValidString(k) {
			skipped = append(skipped, fmt.Errorf("xdsclient: ISTIO_METAJSON_%q: not UTF-8", k))
			continue
		}
		if err := json.Unmarshal([]byte(info.MetaJSON[k]), &doc); err != nil {
			skipped = append(skipped, fmt.Errorf("xdsclient: ISTIO_METAJSON_%s: %w", k, err))
			continue
		}
		v, err := structpb.NewValue(doc)
		if err != nil {
			skipped = append(skipped, fmt.Errorf("xdsclient: ISTIO_METAJSON_%s: %w", k, err))
			continue
		}
		fields[k] = v
	}
	ns := info.PodNamespace
	id := "ztunnel~" + info.InstanceIP + "~" + info.PodName + "." + ns + "~" + ns + ".svc.cluster.local"
	return &corev3.Node{
		Id:       strings.ToValidUTF8(id, "\uFFFD"),
		Metadata: &structpb.Struct{Fields: fields},
	}, skipped
}
