package logging

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// ScopeKey is the attribute that names a record's scope (ztunnel's target).
const ScopeKey = "scope"

// ztunnelTargets maps the short scopes the daemon's packages log under to
// the tracing target ztunnel logs the same events under: its module path
// without the crate prefix, as its plain format prints it. Log alerts and
// RUST_LOG directives written for ztunnel then match ("xds=debug" still
// matches "xds::client", by prefix). A scope not listed is its own target
// (call sites may name a module path directly: "proxy::h2::server").
var ztunnelTargets = map[string]string{
	"xds":      "xds::client",
	"identity": "identity::manager",
	"inpod":    "inpod::statemanager",
	"hbone":    "proxy::pool",
	"state":    "state",
	"admin":    "admin",
	"metrics":  "metrics",
	"dns":      "dns",
	"access":   "access",
}

// targetOf is the target a record of scope is written and filtered under.
func targetOf(scope string) string {
	if t, ok := ztunnelTargets[scope]; ok {
		return t
	}
	return scope
}

// explicitTargets are the targets ztunnel names itself (target: "access")
// rather than taking a module path, and its crate root: its JSON format
// writes them as they are, every other target with its crate prefix.
var explicitTargets = map[string]bool{"access": true, "dns": true, "ztunnel": true}

// jsonScope is the JSON "scope" of target: ztunnel's JSON format writes the
// full tracing target (ztunnel::xds::client), its plain format strips the
// crate prefix.
func jsonScope(target string) string {
	if explicitTargets[target] {
		return target
	}
	return "ztunnel::" + target
}

// Options configures a Handler. The zero value writes the plain format at
// info for every scope.
type Options struct {
	// Format is "plain" (the default) or "json", as LOG_FORMAT.
	Format string
	// Levels filters records by scope and level; nil logs info and above.
	Levels *Levels
	// DefaultScope is the scope of records without a scope attribute
	// (default "ztunnel").
	DefaultScope string
}

// New returns a logger writing to w with a handler built from opts.
func New(w io.Writer, opts Options) *slog.Logger { return slog.New(NewHandler(w, opts)) }

// Handler is a slog.Handler writing ztunnel's plain or JSON lines. Each
// record is formatted into a pooled buffer and written with one Write
// under a mutex shared by all handlers derived from the same NewHandler.
type Handler struct {
	out      *output
	json     bool
	levels   *Levels
	defScope string

	scope  string // fixed by WithAttrs(scope=...); "" = decided per record
	prefix string // group prefix, "g1.g2."
	pre    []byte // the WithAttrs fields, formatted; each field starts with a separator

	cache *atomic.Pointer[scopeLevel] // the fixed scope's level, per Levels generation
}

type output struct {
	mu sync.Mutex // serializes writes
	w  io.Writer
}

type scopeLevel struct {
	gen   uint64
	level slog.Level
}

// NewHandler returns a handler writing to w.
func NewHandler(w io.Writer, opts Options) *Handler {
	h := &Handler{out: &output{w: w}, json: opts.Format == "json", levels: opts.Levels, defScope: targetOf(opts.DefaultScope)}
	if h.defScope == "" {
		h.defScope = "ztunnel"
	}
	return h
}

func (h *Handler) clone() *Handler {
	c := *h
	c.pre = slices.Clip(h.pre)
	return &c
}

// Enabled reports whether level passes the filter. For a handler whose
// scope is fixed this is exact, from a per-generation cache; otherwise it
// is the lowest level any scope logs, and Handle decides once it sees the
// record's scope attribute.
func (h *Handler) Enabled(_ context.Context, level slog.Level) bool {
	if h.levels == nil {
		return level >= slog.LevelInfo
	}
	if h.scope != "" {
		return level >= h.fixedLevel()
	}
	return level >= h.levels.minLevel()
}

func (h *Handler) fixedLevel() slog.Level {
	gen := h.levels.gen.Load()
	if c := h.cache.Load(); c != nil && c.gen == gen {
		return c.level
	}
	// Read the generation before the filter: a racing change leaves a
	// stale generation behind, which the next call recomputes.
	c := &scopeLevel{gen: gen, level: h.levels.Level(h.scope)}
	h.cache.Store(c)
	return c.level
}

// WithAttrs returns a handler whose records carry attrs. A top-level
// "scope" attribute fixes the scope instead of being printed.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	c := h.clone()
	for _, a := range attrs {
		if c.prefix == "" && a.Key == ScopeKey {
			c.scope = targetOf(a.Value.Resolve().String())
			c.cache = new(atomic.Pointer[scopeLevel])
			continue
		}
		c.pre = c.appendAttr(c.pre, c.prefix, a)
	}
	return c
}

// WithGroup returns a handler that prefixes later attribute keys with
// name and a dot (ztunnel's field names are dotted: src.addr).
func (h *Handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := h.clone()
	c.prefix += name + "."
	return c
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// Handle formats and writes r if its scope's level lets it through.
func (h *Handler) Handle(_ context.Context, r slog.Record) error {
	scope := h.scope
	if h.prefix == "" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == ScopeKey {
				scope = targetOf(a.Value.Resolve().String())
				return false
			}
			return true
		})
	}
	if scope == "" {
		scope = h.defScope
	}
	if h.levels != nil {
		if !h.levels.Enabled(scope, r.Level) {
			return nil
		}
	} else if r.Level < slog.LevelInfo {
		return nil
	}
	t := r.Time
	if t.IsZero() {
		t = time.Now()
	}
	bp := bufPool.Get().(*[]byte)
	b := (*bp)[:0]
	if h.json {
		b = h.appendJSON(b, t, scope, &r)
	} else {
		b = h.appendPlain(b, t, scope, &r)
	}
	h.out.mu.Lock()
	_, err := h.out.w.Write(b)
	h.out.mu.Unlock()
	if cap(b) <= 64<<10 {
		*bp = b
		bufPool.Put(bp)
	}
	return err
}

// appendTime writes ztunnel's timestamp: UTC, RFC 3339, microseconds.
func appendTime(b []byte, t time.Time) []byte {
	return t.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z")
}

// appendPlain writes "<time>\t<level>\t<scope>\t<message>\t<k=v ...>\n".
func (h *Handler) appendPlain(b []byte, t time.Time, scope string, r *slog.Record) []byte {
	b = appendTime(b, t)
	b = append(b, '\t')
	b = append(b, levelName(r.Level)...)
	b = append(b, '\t')
	b = append(b, scope...)
	b = append(b, '\t')
	b = append(b, r.Message...)
	b = append(b, '\t')
	start := len(b)
	b = append(b, h.pre...)
	b = h.appendAttrs(b, r)
	if len(b) > start && b[start] == ' ' {
		// Fields are written with a leading separator; the first needs none.
		b = append(b[:start], b[start+1:]...)
	}
	return append(b, '\n')
}

// appendAttrs writes the record's fields, each with its leading separator;
// the scope field is the line's own column, not repeated as a field.
func (h *Handler) appendAttrs(b []byte, r *slog.Record) []byte {
	r.Attrs(func(a slog.Attr) bool {
		if h.prefix == "" && a.Key == ScopeKey {
			return true
		}
		b = h.appendAttr(b, h.prefix, a)
		return true
	})
	return b
}

// appendJSON writes {"level":..,"time":..,"scope":..,"message":..,fields}.
func (h *Handler) appendJSON(b []byte, t time.Time, scope string, r *slog.Record) []byte {
	b = append(b, `{"level":"`...)
	b = append(b, levelName(r.Level)...)
	b = append(b, `","time":"`...)
	b = appendTime(b, t)
	b = append(b, `","scope":`...)
	b = appendJSONString(b, jsonScope(scope))
	b = append(b, `,"message":`...)
	b = appendJSONString(b, r.Message)
	b = append(b, h.pre...)
	b = h.appendAttrs(b, r)
	return append(b, "}\n"...)
}

// appendAttr writes one field, flattening groups into dotted keys, with a
// leading separator (" " plain, "," JSON).
func (h *Handler) appendAttr(b []byte, prefix string, a slog.Attr) []byte {
	v := a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return b
	}
	if v.Kind() == slog.KindGroup {
		attrs := v.Group()
		if len(attrs) == 0 {
			return b
		}
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, ga := range attrs {
			b = h.appendAttr(b, p, ga)
		}
		return b
	}
	if h.json {
		b = append(b, ',')
		b = appendJSONString(b, prefix+a.Key)
		b = append(b, ':')
		return appendJSONValue(b, v)
	}
	b = append(b, ' ')
	b = append(b, prefix...)
	b = append(b, a.Key...)
	b = append(b, '=')
	return appendPlainValue(b, v)
}

// appendPlainValue follows ztunnel's (tracing's Debug) rendering: strings
// and errors quoted, numbers and values with a String method (addresses,
// durations) bare.
func appendPlainValue(b []byte, v slog.Value) []byte {
	switch v.Kind() {
	case slog.KindString:
		return strconv.AppendQuote(b, v.String())
	case slog.KindInt64:
		return strconv.AppendInt(b, v.Int64(), 10)
	case slog.KindUint64:
		return strconv.AppendUint(b, v.Uint64(), 10)
	case slog.KindFloat64:
		return strconv.AppendFloat(b, v.Float64(), 'g', -1, 64)
	case slog.KindBool:
		return strconv.AppendBool(b, v.Bool())
	case slog.KindDuration:
		return append(b, v.Duration().String()...)
	case slog.KindTime:
		return v.Time().AppendFormat(b, time.RFC3339Nano)
	}
	switch x := v.Any().(type) {
	case error:
		return strconv.AppendQuote(b, x.Error())
	case fmt.Stringer:
		return append(b, x.String()...)
	case []byte:
		return strconv.AppendQuote(b, string(x))
	}
	return fmt.Appendf(b, "%+v", v.Any())
}

func appendJSONValue(b []byte, v slog.Value) []byte {
	switch v.Kind() {
	case slog.KindString:
		return appendJSONString(b, v.String())
	case slog.KindInt64:
		return strconv.AppendInt(b, v.Int64(), 10)
	case slog.KindUint64:
		return strconv.AppendUint(b, v.Uint64(), 10)
	case slog.KindFloat64:
		f := v.Float64()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return appendJSONString(b, strconv.FormatFloat(f, 'g', -1, 64))
		}
		return strconv.AppendFloat(b, f, 'g', -1, 64)
	case slog.KindBool:
		return strconv.AppendBool(b, v.Bool())
	case slog.KindDuration:
		return appendJSONString(b, v.Duration().String())
	case slog.KindTime:
		return appendJSONString(b, v.Time().Format(time.RFC3339Nano))
	}
	switch x := v.Any().(type) {
	case error:
		return appendJSONString(b, x.Error())
	case json.Marshaler:
		if j, err := x.MarshalJSON(); err == nil && json.Valid(j) {
			return append(b, j...)
		}
	case fmt.Stringer:
		return appendJSONString(b, x.String())
	case []byte:
		return appendJSONString(b, string(x))
	}
	if j, err := json.Marshal(v.Any()); err == nil {
		return append(b, j...)
	}
	return appendJSONString(b, fmt.Sprintf("%+v", v.Any()))
}

const hexDigits = "0123456789abcdef"

// appendJSONString writes s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
