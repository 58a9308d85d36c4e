package logging

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Levels beyond slog's four, for RUST_LOG's trace and off.
const (
	LevelTrace = slog.LevelDebug - 4
	LevelOff   = slog.Level(1 << 20) // above any record's level
)

// ErrBadDirective is wrapped by the errors of ParseLevel and the Levels
// methods for a directive they cannot read.
var ErrBadDirective = errors.New("logging: bad log directive")

// ParseLevel reads a RUST_LOG level: trace, debug, info, warn (or warning),
// error, off, in any case, or the digits 0 (off) to 5 (trace).
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "trace", "5":
		return LevelTrace, nil
	case "debug", "4":
		return slog.LevelDebug, nil
	case "info", "3":
		return slog.LevelInfo, nil
	case "warn", "warning", "2":
		return slog.LevelWarn, nil
	case "error", "1":
		return slog.LevelError, nil
	case "off", "0":
		return LevelOff, nil
	}
	return 0, fmt.Errorf("%w: %q is not a level (trace, debug, info, warn, error, off)", ErrBadDirective, s)
}

// levelName is the lower-case name ztunnel prints; levels between slog's
// named ones round down.
func levelName(l slog.Level) string {
	switch {
	case l >= LevelOff:
		return "off"
	case l >= slog.LevelError:
		return "error"
	case l >= slog.LevelWarn:
		return "warn"
	case l >= slog.LevelInfo:
		return "info"
	case l >= slog.LevelDebug:
		return "debug"
	}
	return "trace"
}

// directive is "target=level". Scopes are matched by prefix, as tracing's
// targets are; the longest matching target wins.
type directive struct {
	target string // as written, for String
	match  string // the prefix compared with scopes
	// notAccess marks the "ztunnel" target: in ztunnel every module's
	// target starts with "ztunnel::" except the access log's, so a
	// directive for "ztunnel" covers every scope but "access".
	notAccess bool
	level     slog.Level
}

// filter is one immutable set of directives.
type filter struct {
	hasDefault bool
	def        slog.Level // LevelOff without a bare level: tracing enables nothing unmatched
	scoped     []directive
	min        slog.Level // the lowest level any scope enables
}

func (f *filter) level(scope string) slog.Level {
	for i := range f.scoped {
		d := &f.scoped[i]
		if strings.HasPrefix(scope, d.match) && !(d.notAccess && scope == "access") {
			return d.level
		}
	}
	return f.def
}

// with returns f with ds applied on top: a directive for a target already
// present replaces it, a bare level replaces the default.
func (f *filter) with(ds []directive, def *slog.Level) *filter {
	n := &filter{hasDefault: f.hasDefault, def: f.def}
	if def != nil {
		n.hasDefault, n.def = true, *def
	}
	n.scoped = append(n.scoped, f.scoped...)
	for _, d := range ds {
		i := slices.IndexFunc(n.scoped, func(e directive) bool { return e.match == d.match && e.notAccess == d.notAccess })
		if i >= 0 {
			n.scoped[i] = d
		} else {
			n.scoped = append(n.scoped, d)
		}
	}
	// Most specific first, so that level() can stop at the first match.
	slices.SortStableFunc(n.scoped, func(a, b directive) int {
		if len(a.match) != len(b.match) {
			return len(b.match) - len(a.match)
		}
		return strings.Compare(a.target, b.target)
	})
	n.min = n.def
	for _, d := range n.scoped {
		n.min = min(n.min, d.level)
	}
	return n
}

// String prints the directives in RUST_LOG syntax, the default level last.
func (f *filter) String() string {
	parts := make([]string, 0, len(f.scoped)+1)
	for _, d := range f.scoped {
		parts = append(parts, d.target+"="+levelName(d.level))
	}
	if f.hasDefault {
		parts = append(parts, levelName(f.def))
	}
	return strings.Join(parts, ",")
}

// parseSpec reads comma-separated directives: "level", "target=level" and,
// as istioctl sends them, "target:level". strict (the admin endpoint, as
// ztunnel's) refuses a bare word that is not a level; otherwise (RUST_LOG)
// a bare target means that target at trace, as tracing reads it.
func parseSpec(spec string, strict bool) (ds []directive, def *slog.Level, err error) {
	for _, clause := range strings.Split(spec, ",") {
		clause = strings.TrimSpace(clause)
		if clause == "" {
			continue
		}
		target, lvl, ok := splitDirective(clause)
		if !ok {
			l, lerr := ParseLevel(clause)
			if lerr == nil {
				def = &l
				continue
			}
			if strict || !validTarget(clause) {
				return nil, nil, fmt.Errorf("%w: %q is neither a level nor target=level", ErrBadDirective, clause)
			}
			target, lvl = clause, "trace"
		}
		if !validTarget(target) {
			return nil, nil, fmt.Errorf("%w: %q: bad target %q", ErrBadDirective, clause, target)
		}
		l, lerr := ParseLevel(lvl)
		if lerr != nil {
			return nil, nil, fmt.Errorf("%w (in %q)", lerr, clause)
		}
		d := directive{target: target, match: target, level: l}
		switch {
		case target == "ztunnel":
			d.match, d.notAccess = "", true
		case strings.HasPrefix(target, "ztunnel::"):
			// Our scopes are ztunnel's targets without the crate prefix,
			// which ztunnel's log lines leave out too.
			d.match = strings.TrimPrefix(target, "ztunnel::")
		}
		ds = append(ds, d)
	}
	return ds, def, nil
}

// splitDirective splits "target=level" or "target:level" (a single colon:
// "::" belongs to Rust paths).
func splitDirective(s string) (target, level string, ok bool) {
	if t, l, found := strings.Cut(s, "="); found {
		return strings.TrimSpace(t), strings.TrimSpace(l), true
	}
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || s[i-1] == ':' {
		return "", "", false
	}
	return strings.TrimSpace(s[:i]), strings.TrimSpace(s[i+1:]), true
}

// validTarget accepts what tracing accepts as a plain target: no spans or
// field filters ([, {), no spaces.
func validTarget(t string) bool {
	return t != "" && !strings.ContainsAny(t, "[]{}\"= \t")
}

// Levels is the live, per-scope log filter: parsed from RUST_LOG at start,
// changed by the admin endpoint, read on every log call without a lock.
type Levels struct {
	initial *filter // what Reset returns to
	cur     atomic.Pointer[filter]
	gen     atomic.Uint64 // bumped on every change; handlers cache per generation

	mu sync.Mutex // serializes changes
}

// NewLevels parses spec in RUST_LOG syntax ("" means "info", ztunnel's
// default): comma-separated "level" (the default for every scope) and
// "target=level" directives. A target matches every scope it prefixes;
// "ztunnel::proxy" matches scope "proxy"; "ztunnel" matches every scope but
// "access". With no bare level, scopes no directive matches log nothing,
// as with RUST_LOG.
func NewLevels(spec string) (*Levels, error) {
	if strings.TrimSpace(spec) == "" {
		spec = "info"
	}
	ds, def, err := parseSpec(spec, false)
	if err != nil {
		return nil, err
	}
	l := &Levels{initial: (&filter{def: LevelOff}).with(ds, def)}
	l.cur.Store(l.initial)
	return l, nil
}

// String is the current filter in RUST_LOG syntax (what /logging prints).
func (l *Levels) String() string { return l.cur.Load().String() }

// Set applies directives on top of the current filter (admin
// POST /logging?level=...): "debug" changes the default level,
// "access=debug" or "access:debug" one scope's. Bare words that are not
// levels are refused.
func (l *Levels) Set(directives string) error {
	return l.update(directives, false)
}

// Reset returns to the filter the daemon started with, then applies
// directives (admin POST /logging?reset[&level=...]).
func (l *Levels) Reset(directives string) error {
	return l.update(directives, true)
}

func (l *Levels) update(spec string, reset bool) error {
	ds, def, err := parseSpec(spec, true)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	base := l.cur.Load()
	if reset {
		base = l.initial
	}
	l.cur.Store(base.with(ds, def))
	l.gen.Add(1)
	return nil
}

// Level is the lowest level logged for scope.
func (l *Levels) Level(scope string) slog.Level { return l.cur.Load().level(scope) }

// Enabled reports whether a record of scope at level is logged.
func (l *Levels) Enabled(scope string, level slog.Level) bool {
	return level >= l.cur.Load().level(scope)
}

// minLevel is the lowest level any scope logs: the answer for a record
// whose scope is not known until its attributes are read.
func (l *Levels) minLevel() slog.Level { return l.cur.Load().min }
