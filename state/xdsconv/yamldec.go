package xdsconv

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ConfigError is a problem at one place of a local config file.
type ConfigError struct {
	Line, Column int    // 1-based position of the offending node; 0 if unknown
	Path         string // where in the document, e.g. "workloads[0].workloadIps[1]"
	Msg          string
}

// Error returns "local config: line N: path: msg".
func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("local config: ")
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// nodeBudget bounds the nodes a document of n bytes may expand to, so that
// aliases cannot blow a small file up into an enormous config: without
// aliases a document has fewer nodes than bytes, so this leaves room for
// ordinary alias reuse and nothing more.
func nodeBudget(n int) int { return 100_000 + 10*n }

// decoder walks a yaml.Node tree with ztunnel's schema. Its methods return
// *ConfigError.
type decoder struct {
	budget int
}

func errAt(n *yaml.Node, path, format string, args ...any) error {
	return &ConfigError{Line: n.Line, Column: n.Column, Path: path, Msg: fmt.Sprintf(format, args...)}
}

// resolve follows aliases and charges the node against the budget.
func (d *decoder) resolve(n *yaml.Node, path string) (*yaml.Node, error) {
	for hops := 0; n.Kind == yaml.AliasNode; hops++ {
		if n.Alias == nil || hops > 100 {
			return nil, errAt(n, path, "unresolvable alias")
		}
		n = n.Alias
	}
	d.budget--
	if d.budget < 0 {
		return nil, errAt(n, path, "document expands to too many nodes (aliases?)")
	}
	return n, nil
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an unexpected node"
}

// fieldFunc decodes one field's value; path names the field.
type fieldFunc func(d *decoder, n *yaml.Node, path string) error

// object decodes a mapping whose keys must be among fields; the required
// fields must be present. A null value counts as absent. typ names the object
// in errors ("field fooBar not found in workload").
func (d *decoder) object(n *yaml.Node, path, typ string, fields map[string]fieldFunc, required ...string) error {
	n, err := d.resolve(n, path)
	if err != nil {
		return err
	}
	if n.Kind != yaml.MappingNode {
		return errAt(n, path, "expected a %s mapping, got %s", typ, kindName(n))
	}
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := d.resolve(n.Content[i], path)
		if err != nil {
			return err
		}
		if k.Kind != yaml.ScalarNode {
			return errAt(k, path, "expected a field name, got %s", kindName(k))
		}
		f, ok := fields[k.Value]
		if !ok {
			return errAt(k, path, "field %s not found in %s (known fields: %s)", k.Value, typ, strings.Join(sortedNames(fields), ", "))
		}
		if seen[k.Value] {
			return errAt(k, path, "field %s is set twice", k.Value)
		}
		seen[k.Value] = true
		v, err := d.resolve(n.Content[i+1], join(path, k.Value))
		if err != nil {
			return err
		}
		if isNull(v) {
			seen[k.Value] = false // null is as good as absent
			continue
		}
		if err := f(d, v, join(path, k.Value)); err != nil {
			return err
		}
	}
	for _, r := range required {
		if !seen[r] {
			return errAt(n, path, "missing field %s in %s", r, typ)
		}
	}
	return nil
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func sortedNames(fields map[string]fieldFunc) []string {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// list calls item for each element of a sequence (null is an empty list).
func (d *decoder) list(n *yaml.Node, path string, item func(n *yaml.Node, path string) error) error {
	n, err := d.resolve(n, path)
	if err != nil || isNull(n) {
		return err
	}
	if n.Kind != yaml.SequenceNode {
		return errAt(n, path, "expected a list, got %s", kindName(n))
	}
	for i, c := range n.Content {
		p := path + "[" + strconv.Itoa(i) + "]"
		c, err := d.resolve(c, p)
		if err != nil {
			return err
		}
		if err := item(c, p); err != nil {
			return err
		}
	}
	return nil
}

// mapping calls entry for each key/value pair of a mapping (null is empty);
// duplicate keys are rejected.
func (d *decoder) mapping(n *yaml.Node, path string, entry func(k, v *yaml.Node, path string) error) error {
	n, err := d.resolve(n, path)
	if err != nil || isNull(n) {
		return err
	}
	if n.Kind != yaml.MappingNode {
		return errAt(n, path, "expected a mapping, got %s", kindName(n))
	}
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := d.resolve(n.Content[i], path)
		if err != nil {
			return err
		}
		if k.Kind != yaml.ScalarNode {
			return errAt(k, path, "expected a scalar key, got %s", kindName(k))
		}
		p := path + "[" + strconv.Quote(k.Value) + "]"
		if seen[k.Value] {
			return errAt(k, path, "key %q is set twice", k.Value)
		}
		seen[k.Value] = true
		v, err := d.resolve(n.Content[i+1], p)
		if err != nil {
			return err
		}
		if err := entry(k, v, p); err != nil {
			return err
		}
	}
	return nil
}

// scalar returns the text of a scalar node. Any scalar reads as a string
// (name: 123 is "123"), as it does for ztunnel.
func scalar(n *yaml.Node, path, what string) (string, error) {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		return "", errAt(n, path, "expected %s, got %s", what, kindName(n))
	}
	return n.Value, nil
}

func str(dst *string) fieldFunc {
	return func(_ *decoder, n *yaml.Node, path string) (err error) {
		*dst, err = scalar(n, path, "a string")
		return err
	}
}

func strList(dst *[]string) fieldFunc {
	return func(d *decoder, n *yaml.Node, path string) error {
		return d.list(n, path, func(n *yaml.Node, path string) error {
			s, err := scalar(n, path, "a string")
			*dst = append(*dst, s)
			return err
		})
	}
}

func boolean(dst *bool) fieldFunc {
	return func(_ *decoder, n *yaml.Node, path string) error {
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			return errAt(n, path, "expected true or false, got %s", kindName(n))
		}
		return n.Decode(dst)
	}
}

// integer reads an unsigned integer no larger than limit.
func integer(n *yaml.Node, path, what string, limit uint64) (uint64, error) {
	var v int64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil || v < 0 || uint64(v) > limit {
		return 0, errAt(n, path, "invalid %s %s: want an integer from 0 to %d", what, kindName(n), limit)
	}
	return uint64(v), nil
}

func port(n *yaml.Node, path string) (uint16, error) {
	v, err := integer(n, path, "port", 65535)
	return uint16(v), err
}

func u16(dst *uint16, what string) fieldFunc {
	return func(_ *decoder, n *yaml.Node, path string) error {
		v, err := integer(n, path, what, 65535)
		*dst = uint16(v)
		return err
	}
}

func u32(dst *uint32, what string) fieldFunc {
	return func(_ *decoder, n *yaml.Node, path string) error {
		v, err := integer(n, path, what, 1<<32-1)
		*dst = uint32(v)
		return err
	}
}

func portList(dst *[]uint16) fieldFunc {
	return func(d *decoder, n *yaml.Node, path string) error {
		return d.list(n, path, func(n *yaml.Node, path string) error {
			p, err := port(n, path)
			*dst = append(*dst, p)
			return err
		})
	}
}

// portMap reads {servicePort: targetPort}.
func portMap(dst *map[uint16]uint16) fieldFunc {
	return func(d *decoder, n *yaml.Node, path string) error {
		m := map[uint16]uint16{}
		err := d.mapping(n, path, func(k, v *yaml.Node, path string) error {
			sp, err := port(k, path)
			if err != nil {
				return err
			}
			tp, err := port(v, path)
			m[sp] = tp
			return err
		})
		*dst = m
		return err
	}
}

// parseIP parses a plain IP address; zones are not addresses of workloads.
func parseIP(n *yaml.Node, path string) (netip.Addr, error) {
	s, err := scalar(n, path, "an IP address")
	if err != nil {
		return netip.Addr{}, err
	}
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, errAt(n, path, "invalid IP address %q", s)
	}
	return ip, nil
}

func ipList(dst *[]netip.Addr) fieldFunc {
	return func(d *decoder, n *yaml.Node, path string) error {
		*dst = []netip.Addr{}
		return d.list(n, path, func(n *yaml.Node, path string) error {
			ip, err := parseIP(n, path)
			*dst = append(*dst, ip)
			return err
		})
	}
}

// parsePrefix reads a CIDR ("10.0.0.0/8") or a bare IP (a host prefix).
func parsePrefix(n *yaml.Node, path string) (netip.Prefix, error) {
	s, err := scalar(n, path, "a CIDR")
	if err != nil {
		return netip.Prefix{}, err
	}
	if !strings.Contains(s, "/") {
		ip, err := netip.ParseAddr(s)
		if err == nil && ip.Zone() == "" {
			return netip.PrefixFrom(ip, ip.BitLen()), nil
		}
	} else if p, err := netip.ParsePrefix(s); err == nil {
		return p, nil
	}
	return netip.Prefix{}, errAt(n, path, "invalid CIDR or IP address %q", s)
}

func prefixList(dst *[]netip.Prefix) fieldFunc {
	return func(d *decoder, n *yaml.Node, path string) error {
		return d.list(n, path, func(n *yaml.Node, path string) error {
			p, err := parsePrefix(n, path)
			*dst = append(*dst, p)
			return err
		})
	}
}

// enum reads one of names (ztunnel's Rust variant names, case-sensitive);
// the value is the index in names. An empty name marks a value that has no
// spelling in the file.
func enum[T ~uint8](dst *T, what string, names ...string) fieldFunc {
	return func(_ *decoder, n *yaml.Node, path string) error {
		v, err := enumValue(n, path, what, names)
		*dst = T(v)
		return err
	}
}

func enumValue(n *yaml.Node, path, what string, names []string) (int, error) {
	if n.Kind == yaml.ScalarNode && n.Value != "" {
		if i := slices.Index(names, n.Value); i >= 0 {
			return i, nil
		}
	}
	spelled := slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == "" })
	return 0, errAt(n, path, "invalid %s %s: want one of %s", what, kindName(n), strings.Join(spelled, ", "))
}
