package meta

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseForwarded(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []ForwardedElement
		wantErr bool
	}{
		{"ztunnel for", `for="10.0.0.1:4000"`, []ForwardedElement{{For: "10.0.0.1:4000"}}, false},
		{"for and host", `for="10.0.0.1:4000";host=echo.ns.svc.cluster.local`,
			[]ForwardedElement{{For: "10.0.0.1:4000", Host: "echo.ns.svc.cluster.local"}}, false},
		{"ipv6 quoted", `For="[2001:db8:cafe::17]:4711"`, []ForwardedElement{{For: "[2001:db8:cafe::17]:4711"}}, false},
		{"case-insensitive names", `FOR=192.0.2.60;PROTO=http;BY=203.0.113.43`,
			[]ForwardedElement{{For: "192.0.2.60", Proto: "http", By: "203.0.113.43"}}, false},
		{"list of hops", `for=192.0.2.43, for=198.51.100.17;host=a`,
			[]ForwardedElement{{For: "192.0.2.43"}, {For: "198.51.100.17", Host: "a"}}, false},
		{"spaces around separators", ` for=a ; host=b ,  for=c `,
			[]ForwardedElement{{For: "a", Host: "b"}, {For: "c"}}, false},
		{"empty elements skipped", `,for=a,,`, []ForwardedElement{{For: "a"}}, false},
		{"quoted pair", `host="a\"b\\c"`, []ForwardedElement{{Host: `a"b\c`}}, false},
		{"obfuscated identifier", `for=_hidden;by=unknown`, []ForwardedElement{{For: "_hidden", By: "unknown"}}, false},
		{"extension dropped", `for=a;secret=x`, []ForwardedElement{{For: "a"}}, false},
		{"empty header", ``, nil, false},
		{"unquoted ipv6 port", `for=[::1]:80`, nil, true},
		{"duplicate in element", `for=a;for=b`, nil, true},
		{"missing value", `for=`, nil, true},
		{"missing equals", `for`, nil, true},
		{"unterminated quote", `for="abc`, nil, true},
		{"control byte in quote", "for=\"a\x01b\"", nil, true},
		{"garbage after value", `for=a b`, nil, true},
		{"backslash at end", `for="a\`, nil, true},
		{"too long", "for=" + strings.Repeat("a", maxForwardedLen), nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseForwarded(tc.in)
			if tc.wantErr {
				if !errors.Is(err, ErrForwarded) {
					t.Fatalf("got %+v, %v; want an ErrForwarded", got, err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestFormatForwarded(t *testing.T) {
	tests := []struct {
		name string
		in   []ForwardedElement
		want string
	}{
		{"client address", []ForwardedElement{{For: "10.0.0.1:4000"}}, `for="10.0.0.1:4000"`},
		{"ipv6 and host", []ForwardedElement{{For: "[fd00::1]:80", Host: "svc.ns.svc.cluster.local"}},
			`for="[fd00::1]:80";host=svc.ns.svc.cluster.local`},
		{"quote escaped", []ForwardedElement{{Host: `a"b`}}, `host="a\"b"`},
		{"two hops", []ForwardedElement{{For: "a"}, {For: "b", Proto: "https"}}, `for=a, for=b;proto=https`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := FormatForwarded(tc.in...)
			if got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
			back, err := ParseForwarded(got)
			if err != nil || !reflect.DeepEqual(back, tc.in) {
				t.Fatalf("re-parsed %+v, %v", back, err)
			}
		})
	}
}

func TestParseBaggage(t *testing.T) {
	full := "k8s.cluster.name=c1,k8s.namespace.name=ns,k8s.deployment.name=web,service.name=web,service.version=v1," +
		"cloud.region=r1,cloud.availability_zone=z1"
	tests := []struct {
		name    string
		in      string
		want    Baggage
		wantErr bool
	}{
		{"ztunnel form", full, Baggage{ClusterID: "c1", Namespace: "ns", WorkloadType: "deployment", WorkloadName: "web",
			ServiceName: "web", ServiceVersion: "v1", Region: "r1", Zone: "z1"}, false},
		{"pod kind", "k8s.pod.name=p-1", Baggage{WorkloadType: "pod", WorkloadName: "p-1"}, false},
		{"node is not a workload", "k8s.node.name=n1,k8s.job.name=j", Baggage{WorkloadType: "job", WorkloadName: "j"}, false},
		{"first kind wins", "k8s.job.name=j,k8s.pod.name=p", Baggage{WorkloadType: "job", WorkloadName: "j"}, false},
		{"spaces and properties", " k8s.namespace.name = ns ;prop;p2=v , service.name=s",
			Baggage{Namespace: "ns", ServiceName: "s"}, false},
		{"percent-decoded", "service.version=v%201%2C2", Baggage{ServiceVersion: "v 1,2"}, false},
		{"unknown keys ignored", "userId=alice,k8s.namespace.name=ns", Baggage{Namespace: "ns"}, false},
		{"empty value", "service.name=", Baggage{}, false},
		{"empty members", ",,k8s.namespace.name=ns,", Baggage{Namespace: "ns"}, false},
		{"no value", "k8s.namespace.name", Baggage{}, true},
		{"bad key", "k8s namespace=ns", Baggage{}, true},
		{"quote in value", `service.name="x"`, Baggage{}, true},
		{"bad escape", "service.name=%zz", Baggage{}, true},
		{"bad property", "a=b;=c", Baggage{}, true},
		{"too long", "a=" + strings.Repeat("b", MaxBaggageLen), Baggage{}, true},
		{"too many members", strings.Repeat("a=b,", MaxBaggageMembers+1), Baggage{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBaggage(tc.in)
			if tc.wantErr {
				if !errors.Is(err, ErrBaggage) {
					t.Fatalf("got %+v, %v; want an ErrBaggage", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestFormatBaggage(t *testing.T) {
	tests := []struct {
		name string
		in   Baggage
		want string
	}{
		{"full", Baggage{ClusterID: "Kubernetes", Namespace: "default", WorkloadType: "deployment", WorkloadName: "client",
			ServiceName: "client", ServiceVersion: "latest", Region: "r", Zone: "z"},
			"k8s.cluster.name=Kubernetes,k8s.namespace.name=default,k8s.deployment.name=client,service.name=client," +
				"service.version=latest,cloud.region=r,cloud.availability_zone=z"},
		{"empties omitted", Baggage{Namespace: "ns", WorkloadType: "pod", WorkloadName: "p"}, "k8s.namespace.name=ns,k8s.pod.name=p"},
		{"escaped", Baggage{ServiceVersion: "a b,c%"}, "service.version=a%20b%2Cc%25"},
		{"bad kind dropped", Baggage{WorkloadType: "a.b", WorkloadName: "x", Namespace: "ns"}, "k8s.namespace.name=ns"},
		{"nothing", Baggage{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.String()
			if got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
			back, err := ParseBaggage(got)
			if tc.name != "bad kind dropped" && (err != nil || back != tc.in) {
				t.Fatalf("re-parsed %+v, %v; want %+v", back, err, tc.in)
			}
		})
	}
}

func TestTraceParent(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr bool
	}{
		{"w3c example", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"future version with suffix", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", false},
		{"version 00 with suffix", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", true},
		{"version ff", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"upper-case hex", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", true},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", true},
		{"zero parent id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", true},
		{"short", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", true},
		{"bad separator", "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"future version no dash", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTraceParent(tc.in)
			if tc.wantErr {
				if !errors.Is(err, ErrTraceParent) {
					t.Fatalf("got %+v, %v; want an ErrTraceParent", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := got.String(); s != tc.in[:traceParentLen] && tc.in[:2] == "00" {
				t.Fatalf("formatted %s, want %s", s, tc.in)
			}
		})
	}
	t.Run("generated values parse back", func(t *testing.T) {
		seen := map[TraceParent]bool{}
		for range 100 {
			tp := NewTraceParent()
			back, err := ParseTraceParent(tp.String())
			if err != nil || back != tp {
				t.Fatalf("%s parsed as %+v, %v", tp, back, err)
			}
			seen[tp] = true
		}
		if len(seen) != 100 {
			t.Fatalf("%d distinct values of 100", len(seen))
		}
	})
}

func FuzzForwarded(f *testing.F) {
	f.Add(`for="10.0.0.1:4000";host=echo.ns.svc.cluster.local`)
	f.Add(`for=192.0.2.43, for="[2001:db8:cafe::17]:4711";proto=https`)
	f.Add(`host="a\"b"`)
	f.Fuzz(func(t *testing.T, in string) {
		elems, err := ParseForwarded(in)
		if err != nil {
			return
		}
		// Formatting what parsed and parsing again gives the same hops
		// (values with control bytes are dropped on formatting, so skip them).
		for _, e := range elems {
			for _, v := range []string{e.For, e.By, e.Host, e.Proto} {
				if strings.ContainsFunc(v, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
					return
				}
			}
		}
		var nonEmpty []ForwardedElement
		for _, e := range elems {
			if e != (ForwardedElement{}) {
				nonEmpty = append(nonEmpty, e)
			}
		}
		back, err := ParseForwarded(FormatForwarded(nonEmpty...))
		if err != nil || !reflect.DeepEqual(back, nonEmpty) {
			t.Fatalf("%q: re-parsed %+v, %v; want %+v", in, back, err, nonEmpty)
		}
	})
}

func FuzzBaggage(f *testing.F) {
	f.Add("k8s.cluster.name=c1,k8s.namespace.name=ns,k8s.deployment.name=web,service.name=web,service.version=v1")
	f.Add(" a = b ;p;q=r , service.version=v%201")
	f.Add("cloud.region=r,cloud.availability_zone=z")
	f.Fuzz(func(t *testing.T, in string) {
		b, err := ParseBaggage(in)
		if err != nil {
			return
		}
		// The workload fields survive a format/parse round trip.
		back, err := ParseBaggage(b.String())
		if err != nil || back != b {
			t.Fatalf("%q: %+v formatted %q re-parsed %+v, %v", in, b, b.String(), back, err)
		}
	})
}

func FuzzTraceParent(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds")
	f.Fuzz(func(t *testing.T, in string) {
		tp, err := ParseTraceParent(in)
		if err != nil {
			return
		}
		back, err := ParseTraceParent(tp.String())
		if err != nil || back != tp {
			t.Fatalf("%q: re-parsed %+v, %v", in, back, err)
		}
	})
}
