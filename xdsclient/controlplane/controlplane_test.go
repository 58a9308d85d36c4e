package controlplane_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/goleak"

	"github.com/ztunnel-go/ztunnel/xdsclient/controlplane"
	"github.com/ztunnel-go/ztunnel/xdsclient/xdstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openStream dials cfg and opens an ADS stream, returning the first error.
func openStream(t *testing.T, cfg controlplane.Config) error {
	t.Helper()
	cc, err := controlplane.Dial(cfg)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: "t"}); err != nil {
		_, err = st.Recv()
		return err
	}
	_, err = st.Recv()
	return err
}

func TestServerVerification(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{ServerNames: []string{"istiod.istio-system.svc"}})
	other := xdstest.NewTLS(t)
	for _, tc := range []struct {
		name    string
		cfg     controlplane.Config
		wantErr string
	}{
		{"name mismatch", controlplane.Config{Address: srv.Address(), RootCA: srv.TLS().RootFile}, "certificate"},
		{"alt hostname", controlplane.Config{Address: srv.Address(), RootCA: srv.TLS().RootFile, AltHostname: "istiod.istio-system.svc"}, ""},
		{"wrong alt hostname", controlplane.Config{Address: srv.Address(), RootCA: srv.TLS().RootFile, AltHostname: "other"}, "certificate"},
		{"inline root", controlplane.Config{Address: srv.Address(), RootCA: string(srv.TLS().RootPEM), AltHostname: "istiod.istio-system.svc"}, ""},
		{"unknown root", controlplane.Config{Address: srv.Address(), RootCA: other.RootFile, AltHostname: "istiod.istio-system.svc"}, "unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := openStream(t, tc.cfg)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestDialRejects(t *testing.T) {
	for name, cfg := range map[string]controlplane.Config{
		"empty":          {},
		"http":           {Address: "http://istiod:15010"},
		"no host":        {Address: "https://:15012"},
		"missing root":   {Address: "istiod:15012", RootCA: "/nonexistent/root.pem"},
		"no certificate": {Address: "istiod:15012", RootCA: "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"},
	} {
		if cc, err := controlplane.Dial(cfg); err == nil {
			cc.Close()
			t.Errorf("%s: Dial succeeded", name)
		}
	}
}

func TestHeadersFromEnv(t *testing.T) {
	got, err := controlplane.HeadersFromEnv([]string{"XDS_HEADER_X-Team=blue", "XDS_HEADER_Trace=on=1", "CA_HEADER_Y=z", "PATH=/bin"}, "XDS_HEADER_")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"x-team": "blue", "trace": "on=1"}; !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"XDS_HEADER_=x", "XDS_HEADER_a b=x", "XDS_HEADER_a=x\ny"} {
		if _, err := controlplane.HeadersFromEnv([]string{bad}, "XDS_HEADER_"); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
