package meta

import (
	"errors"
	"fmt"
	"strings"
)

// ErrForwarded is wrapped by every Forwarded parse error.
var ErrForwarded = errors.New("meta: invalid forwarded header")

// ForwardedElement is one element of a Forwarded header: one proxy hop.
// Extension parameters are checked for syntax and dropped.
type ForwardedElement struct {
	For, By, Host, Proto string
}

// maxForwardedLen bounds what ParseForwarded reads; HBONE peers limit
// header lists to 64 KiB, and a hop list never needs that much.
const maxForwardedLen = 16 << 10

// ParseForwarded parses a Forwarded header value (several header lines
// joined with ","). Quoted values are unquoted. Parameter names are
// case-insensitive; a parameter repeated within one element is an error, as
// RFC 7239 requires. Empty list elements are skipped (RFC 9110 list rule).
func ParseForwarded(s string) ([]ForwardedElement, error) {
	if len(s) > maxForwardedLen {
		return nil, fmt.Errorf("%w: %d bytes", ErrForwarded, len(s))
	}
	var out []ForwardedElement
	p := parser{s: s}
	for {
		p.skipOWS()
		if p.done() {
			return out, nil
		}
		if p.peek() == ',' {
			p.i++
			continue
		}
		e, err := p.element()
		if err != nil {
			return nil, err
		}
		out = append(out, e)
		p.skipOWS()
		if p.done() {
			return out, nil
		}
		if p.peek() != ',' {
			return nil, p.errorf("want ',' between elements")
		}
		p.i++
	}
}

// element reads pairs separated by ';' up to ',' or the end.
func (p *parser) element() (ForwardedElement, error) {
	var e ForwardedElement
	seen := map[string]bool{}
	for {
		p.skipOWS()
		if p.done() || p.peek() == ',' {
			return e, nil
		}
		if p.peek() == ';' { // empty pair
			p.i++
			continue
		}
		name := strings.ToLower(p.token())
		if name == "" {
			return e, p.errorf("want a parameter name")
		}
		if p.done() || p.peek() != '=' {
			return e, p.errorf("want '=' after %q", name)
		}
		p.i++
		var (
			val string
			err error
		)
		if !p.done() && p.peek() == '"' {
			val, err = p.quoted()
			if err != nil {
				return e, err
			}
		} else if val = p.token(); val == "" {
			return e, p.errorf("want a value for %q", name)
		}
		if seen[name] {
			return e, p.errorf("parameter %q repeated in one element", name)
		}
		seen[name] = true
		switch name {
		case "for":
			e.For = val
		case "by":
			e.By = val
		case "host":
			e.Host = val
		case "proto":
			e.Proto = val
		}
		p.skipOWS()
		if p.done() || p.peek() == ',' {
			return e, nil
		}
		if p.peek() != ';' {
			return e, p.errorf("want ';' or ',' after %q", name)
		}
		p.i++
	}
}

// String formats the element, quoting values that are not tokens
// (addresses with a port or IPv6 brackets always are).
func (e ForwardedElement) String() string {
	var b strings.Builder
	add := func(name, v string) {
		if v == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(';')
		}
		b.WriteString(name)
		b.WriteByte('=')
		writeValue(&b, v)
	}
	add("for", e.For)
	add("by", e.By)
	add("host", e.Host)
	add("proto", e.Proto)
	return b.String()
}

// FormatForwarded joins elements into one header value.
func FormatForwarded(elems ...ForwardedElement) string {
	parts := make([]string, len(elems))
	for i, e := range elems {
		parts[i] = e.String()
	}
	return strings.Join(parts, ", ")
}

func writeValue(b *strings.Builder, v string) {
	if isToken(v) {
		b.WriteString(v)
		return
	}
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		// Bytes no quoted-string may hold (controls) cannot be sent;
		// drop them rather than emit a header the peer must refuse.
		if c < ' ' && c != '\t' || c == 0x7f {
			continue
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
}

// parser scans a header value.
type parser struct {
	s string
	i int
}

func (p *parser) done() bool { return p.i >= len(p.s) }
func (p *parser) peek() byte { return p.s[p.i] }

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at byte %d: %s", ErrForwarded, p.i, fmt.Sprintf(format, args...))
}

func (p *parser) skipOWS() {
	for !p.done() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

func (p *parser) token() string {
	start := p.i
	for !p.done() && isTchar(p.peek()) {
		p.i++
	}
	return p.s[start:p.i]
}

// quoted reads a quoted-string (RFC 9110 section 5.6.4) and unquotes it.
func (p *parser) quoted() (string, error) {
	p.i++ // opening quote
	var b strings.Builder
	for !p.done() {
		c := p.peek()
		p.i++
		switch {
		case c == '"':
			return b.String(), nil
		case c == '\\':
			if p.done() {
				return "", p.errorf("quoted-pair cut off")
			}
			q := p.peek()
			if !(q == '\t' || q >= ' ' && q != 0x7f) {
				return "", p.errorf("byte %#x after backslash", q)
			}
			b.WriteByte(q)
			p.i++
		case c == '\t' || c >= ' ' && c != 0x7f:
			b.WriteByte(c)
		default:
			return "", p.errorf("byte %#x in quoted string", c)
		}
	}
	return "", p.errorf("unterminated quoted string")
}

func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTchar(s[i]) {
			return false
		}
	}
	return true
}
