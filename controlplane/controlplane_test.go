package controlplane_test

import (
	"context"
	"crypto/tls"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/ztunnel-go/ztunnel/controlplane"
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

// TestRootFileLateOrBad: a root file that is missing, then not PEM, fails
// the calls (and CheckRoots says why) without failing Dial; once the real
// roots are written, a connection dialed before the file existed recovers.
func TestRootFileLateOrBad(t *testing.T) {
	srv := xdstest.NewServer(t, xdstest.Options{})
	path := filepath.Join(t.TempDir(), "root-cert.pem")
	cfg := controlplane.Config{Address: srv.Address(), RootCA: path}
	early, err := controlplane.Dial(cfg)
	if err != nil {
		t.Fatalf("Dial with a root file not mounted yet: %v", err)
	}
	defer early.Close()
	call := func(cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx, opts...)
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
	for _, step := range []struct {
		name    string
		content []byte // nil: no file
		wantErr string
	}{
		{"missing", nil, "no such file"},
		{"not PEM", []byte("not a certificate\n"), "no PEM certificate"},
	} {
		if step.content != nil {
			if err := os.WriteFile(path, step.content, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := controlplane.CheckRoots(path); err == nil || !strings.Contains(err.Error(), step.wantErr) {
			t.Errorf("%s: CheckRoots = %v, want %q", step.name, err, step.wantErr)
		}
		// The early connection fails too (its first handshake, with no
		// file); a fresh one sees the bad file.
		cc := early
		if step.content != nil {
			if cc, err = controlplane.Dial(cfg); err != nil {
				t.Fatalf("%s: Dial = %v", step.name, err)
			}
			defer cc.Close()
		}
		if err := call(cc); err == nil || !strings.Contains(err.Error(), step.wantErr) {
			t.Errorf("%s: call = %v, want a handshake failure naming %q", step.name, err, step.wantErr)
		}
	}
	if err := os.WriteFile(path, srv.TLS().RootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := controlplane.CheckRoots(path); err != nil {
		t.Errorf("mounted: CheckRoots = %v", err)
	}
	// WaitForReady: the early connection is in gRPC's reconnect backoff
	// after its failed handshakes; its next attempt reads the new file.
	if err := call(early, grpc.WaitForReady(true)); err != nil {
		t.Errorf("mounted: call on the connection dialed before the file existed = %v", err)
	}
}

// TestCurvePreferences: with COMPLIANCE_POLICY=pqc the control-plane
// connection offers X25519MLKEM768 only, so an istiod that cannot do it is
// refused, and one that can is reached.
func TestCurvePreferences(t *testing.T) {
	classic := xdstest.NewTLS(t)
	classic.ServerConfig = classic.ServerConfig.Clone()
	classic.ServerConfig.CurvePreferences = []tls.CurveID{tls.X25519}
	oldSrv := xdstest.NewServer(t, xdstest.Options{TLS: classic})
	pqSrv := xdstest.NewServer(t, xdstest.Options{})
	pqc := []tls.CurveID{tls.X25519MLKEM768}
	for _, tc := range []struct {
		name   string
		srv    *xdstest.Server
		curves []tls.CurveID
		ok     bool
	}{
		{"default client, classical server", oldSrv, nil, true},
		{"pqc client, classical server", oldSrv, pqc, false},
		{"pqc client, pqc-capable server", pqSrv, pqc, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := openStream(t, controlplane.Config{Address: tc.srv.Address(), RootCA: tc.srv.TLS().RootFile, CurvePreferences: tc.curves})
			if (err == nil) != tc.ok {
				t.Errorf("openStream = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestRootFileIsReReadWhenItChanges(t *testing.T) {
	a, b := xdstest.NewTLS(t), xdstest.NewTLS(t)
	path := filepath.Join(t.TempDir(), "root.pem")
	if err := os.WriteFile(path, a.RootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	pool := controlplane.RootPool(path)
	p1, err := pool()
	if err != nil {
		t.Fatal(err)
	}
	if p2, _ := pool(); p2 != p1 {
		t.Error("unchanged file was parsed again")
	}
	if err := os.WriteFile(path, append(b.RootPEM, a.RootPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, time.Now(), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	p3, err := pool()
	if err != nil || p3 == p1 || p3.Equal(p1) {
		t.Errorf("changed file not re-read (err %v)", err)
	}
}
