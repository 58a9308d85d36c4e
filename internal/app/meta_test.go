package app

import (
	"maps"
	"testing"
)

func TestProxyMetadata(t *testing.T) {
	for _, tc := range []struct {
		name    string
		environ []string
		base    map[string]string
		want    map[string]string
	}{
		{"none", []string{"PATH=/bin", "CLUSTER_ID=c"}, nil, map[string]string{}},
		{"env", []string{"ISTIO_META_CLUSTER_ID=east", "ISTIO_META_DNS_CAPTURE=true", "ISTIO_META_=x"}, nil,
			map[string]string{"CLUSTER_ID": "east", "DNS_CAPTURE": "true"}},
		{"env overrides base", []string{"ISTIO_META_FOO=env"}, map[string]string{"FOO": "pc", "ISTIO_META_BAR": "pc", "BAZ": "pc"},
			map[string]string{"FOO": "env", "BAR": "pc", "BAZ": "pc"}},
		{"value with =", []string{"ISTIO_META_X=a=b"}, nil, map[string]string{"X": "a=b"}},
	} {
		if got := proxyMetadata(tc.environ, tc.base); !maps.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
