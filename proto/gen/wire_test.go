package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// wireContract lists every wire-relevant fact of the protos: each field's
// message, number, name, cardinality, type, oneof and presence; reserved
// ranges; enum values; service methods.
func wireContract(t *testing.T, dir string) []string {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{dir}})}
	files, err := c.Compile(context.Background(), "workload.proto", "authorization.proto", "citadel.proto", "zds.proto")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	enum := func(e protoreflect.EnumDescriptor) {
		for i := range e.Values().Len() {
			v := e.Values().Get(i)
			out = append(out, fmt.Sprintf("enum %s %s=%d", e.FullName(), v.Name(), v.Number()))
		}
	}
	var msg func(m protoreflect.MessageDescriptor)
	msg = func(m protoreflect.MessageDescriptor) {
		for i := range m.Fields().Len() {
			f := m.Fields().Get(i)
			typ := f.Kind().String()
			if f.Message() != nil {
				typ = string(f.Message().FullName())
			}
			if f.Enum() != nil {
				typ = string(f.Enum().FullName())
			}
			oneof := "-"
			if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() {
				oneof = string(o.Name())
			}
			out = append(out, fmt.Sprintf("field %s %d %s %s %s oneof=%s presence=%v", m.FullName(), f.Number(), f.Name(), f.Cardinality(), typ, oneof, f.HasPresence()))
		}
		for i := range m.ReservedRanges().Len() {
			r := m.ReservedRanges().Get(i)
			out = append(out, fmt.Sprintf("reserved %s %d-%d", m.FullName(), r[0], r[1]-1))
		}
		for i := range m.Messages().Len() {
			if !m.Messages().Get(i).IsMapEntry() {
				msg(m.Messages().Get(i))
			}
		}
		for i := range m.Enums().Len() {
			enum(m.Enums().Get(i))
		}
	}
	for _, f := range files {
		for i := range f.Messages().Len() {
			msg(f.Messages().Get(i))
		}
		for i := range f.Enums().Len() {
			enum(f.Enums().Get(i))
		}
		for i := range f.Services().Len() {
			s := f.Services().Get(i)
			for j := range s.Methods().Len() {
				m := s.Methods().Get(j)
				out = append(out, fmt.Sprintf("rpc /%s/%s %s %s", s.FullName(), m.Name(), m.Input().FullName(), m.Output().FullName()))
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestWireCompatibleWithIstio compares the protos with the wire contract of
// Istio's own copies (ztunnel 62d82653, proto/*.proto), recorded in
// testdata/istio-wire.txt. Set UPDATE_WIRE=<dir of Istio's protos> to
// re-record it from a newer Istio.
func TestWireCompatibleWithIstio(t *testing.T) {
	const golden = "testdata/istio-wire.txt"
	if dir := os.Getenv("UPDATE_WIRE"); dir != "" {
		if err := os.WriteFile(golden, []byte(strings.Join(wireContract(t, dir), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	got := wireContract(t, "..")
	for _, l := range got {
		if !slices.Contains(want, l) {
			t.Errorf("not in Istio's protos: %s", l)
		}
	}
	for _, l := range want {
		if !slices.Contains(got, l) {
			t.Errorf("missing from ours: %s", l)
		}
	}
}
