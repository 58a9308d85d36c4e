package state

import (
	"reflect"
	"strconv"
	"testing"
)

// TestServiceSet: a set is sorted by key with each key once (the later
// entry wins, as a map's assignment would), and answers lookups alike
// whether it scans (up to 4 services) or searches.
func TestServiceSet(t *testing.T) {
	many := map[string]map[uint16]uint16{}
	for i := range 9 {
		many["ns/svc-"+strconv.Itoa(i)] = map[uint16]uint16{80: uint16(8080 + i)}
	}
	for _, tc := range []struct {
		name string
		list []ServicePorts
		want map[string]map[uint16]uint16
	}{
		{"empty", nil, map[string]map[uint16]uint16{}},
		{"one", []ServicePorts{{"ns/a", PortMap{{80, 8080}}}}, map[string]map[uint16]uint16{"ns/a": {80: 8080}}},
		{"unsorted, a key twice", []ServicePorts{{"ns/b", nil}, {"ns/a", PortMap{{80, 1}}}, {"ns/a", PortMap{{80, 2}}}},
			map[string]map[uint16]uint16{"ns/a": {80: 2}, "ns/b": {}}},
		{"many", ServicesOf(many).List(), many},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServiceSet(append([]ServicePorts(nil), tc.list...))
			if got := s.Map(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Map() = %v, want %v", got, tc.want)
			}
			if s.Len() != len(tc.want) || (len(tc.want) == 0) != (s == nil) {
				t.Errorf("Len() = %d (set %p), want %d", s.Len(), s, len(tc.want))
			}
			for i, sp := range s.List() {
				if i > 0 && s.List()[i-1].Key >= sp.Key {
					t.Errorf("List() not sorted by key, each once: %v", s.List())
				}
			}
			for k, ports := range tc.want {
				got, ok := s.Ports(k)
				if !ok || !s.Has(k) || !reflect.DeepEqual(got.Map(), ports) {
					t.Errorf("Ports(%q) = %v, %v; want %v", k, got, ok, ports)
				}
			}
			for _, k := range []string{"", "ns/zz", "ns/svc-4x", "a/a"} {
				if _, ok := s.Ports(k); ok || s.Has(k) {
					t.Errorf("Ports(%q) found a missing key", k)
				}
			}
		})
	}
}

// TestPortMap: a port map is sorted by service port with each port once
// (the later pair wins), and Target tells a port mapped to 0 from one not
// mapped.
func TestPortMap(t *testing.T) {
	m := NewPortMap([]PortPair{{9090, 9090}, {80, 1}, {80, 8080}, {443, 0}})
	if want := (PortMap{{80, 8080}, {443, 0}, {9090, 9090}}); !reflect.DeepEqual(m, want) {
		t.Fatalf("NewPortMap = %v, want %v", m, want)
	}
	for _, tc := range []struct {
		port, target uint16
		ok           bool
	}{{80, 8080, true}, {443, 0, true}, {9090, 9090, true}, {81, 0, false}} {
		if got, ok := m.Target(tc.port); got != tc.target || ok != tc.ok {
			t.Errorf("Target(%d) = %d, %v; want %d, %v", tc.port, got, ok, tc.target, tc.ok)
		}
	}
	if NewPortMap(nil) != nil || MakePortMap(map[uint16]uint16{}) != nil {
		t.Error("an empty port map is not nil")
	}
	if got := MakePortMap(map[uint16]uint16{9090: 1, 80: 2}); !reflect.DeepEqual(got, PortMap{{80, 2}, {9090, 1}}) {
		t.Errorf("MakePortMap = %v", got)
	}
}
