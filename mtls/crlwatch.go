package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultCRLPollInterval is how often a CRL's file is checked for a change.
// ztunnel reloads 2 s after the last change it is told of (a debounced
// directory watch); polling at the same period gives the same latency.
const DefaultCRLPollInterval = 2 * time.Second

// CRLConfig configures a CRL.
type CRLConfig struct {
	// Path is the CRL file (CRL_PATH): PEM or DER, see ParseCRLs.
	Path string
	// Anchors returns the CA certificates known now (trust roots and
	// intermediates): a CRL named after one must be signed by it, and a
	// presented chain that stops below the root finds its root here. Nil
	// means none are known; CRLs are then checked against the issuers of
	// verified chains only.
	Anchors func() []*x509.Certificate
	// PollInterval is how often Run looks at the file; default
	// DefaultCRLPollInterval.
	PollInterval time.Duration
	// OnError is told of every load that failed (the last good set stays in
	// force); nil ignores them.
	OnError func(err error)
}

// CRL enforces the certificate revocation lists of one file, reloaded when
// the file changes. The zero of a *CRL (nil) enforces nothing, so callers
// need not test whether CRL_PATH is set.
//
// The file is polled rather than watched with inotify: Kubernetes updates a
// ConfigMap volume by swapping a symlink to a new directory, which a watch on
// the file misses and a watch on the directory sees only as events on
// "..data". Polling stat(2) through the symlink sees every such update, costs
// one syscall per period, and needs no goroutine per watched inode.
//
// A file that fails to load (it does not parse, a CRL is wrongly signed, it
// vanished) leaves the last good set in force and is reported through
// OnError: enforcement is never dropped silently.
type CRL struct {
	cfg CRLConfig
	set atomic.Pointer[CRLSet] // nil until a file loaded

	mu       sync.Mutex // guards the following fields
	stamp    fileStamp  // of the file as last read (good or not)
	subs     map[*crlSub]struct{}
	failures uint64
}

// crlSub is one Subscribe registration.
type crlSub struct{ f func(*CRLSet) }

// fileStamp identifies a version of a file cheaply: a rename onto the path
// (or a symlink swap) changes the inode, a rewrite in place the size or the
// modification time.
type fileStamp struct {
	dev, ino uint64
	size     int64
	mtime    int64
	missing  bool
}

func stampOf(fi os.FileInfo) fileStamp {
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.dev, st.ino = uint64(sys.Dev), sys.Ino // Dev's type differs between architectures
	}
	return st
}

// NewCRL loads cfg.Path once. A missing file is not an error (as in
// ztunnel, the ConfigMap may be mounted later): nothing is revoked until it
// appears. A file that is there but does not load is an error, so a daemon
// does not start without the revocations it was asked to enforce.
func NewCRL(cfg CRLConfig) (*CRL, error) {
	if cfg.Path == "" {
		return nil, errors.New("mtls: CRL path is empty")
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultCRLPollInterval
	}
	c := &CRL{cfg: cfg, subs: make(map[*crlSub]struct{})}
	set, st, err := c.load()
	c.stamp = st
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		c.set.Store(set)
	}
	return c, nil
}

// Set returns the set in force; nil when no file has loaded yet.
func (c *CRL) Set() *CRLSet {
	if c == nil {
		return nil
	}
	return c.set.Load()
}

// Failures is the number of loads that failed since NewCRL.
func (c *CRL) Failures() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failures
}

// Check returns an error wrapping ErrRevoked when every chain of chains
// (verified chains, leaf first, root last) has a certificate revoked by the
// set in force. A nil *CRL revokes nothing.
func (c *CRL) Check(chains [][]*x509.Certificate) error {
	return c.Set().checkChains(chains)
}

// RevokedConn reports whether the peer of a finished TLS handshake
// presented a certificate that the set in force revokes, and which.
func (c *CRL) RevokedConn(cs tls.ConnectionState) (*x509.Certificate, bool) {
	s := c.Set()
	if s.Len() == 0 {
		return nil, false
	}
	return s.revokedConn(cs, c.anchors())
}

func (c *CRL) anchors() []*x509.Certificate {
	if c.cfg.Anchors == nil {
		return nil
	}
	return c.cfg.Anchors()
}

// Subscribe calls f with every new set after it has been put in force, on
// the goroutine that loaded it (Run's), so that open connections can be
// re-checked against it. The returned function ends the subscription.
func (c *CRL) Subscribe(f func(*CRLSet)) (cancel func()) {
	s := &crlSub{f: f}
	c.mu.Lock()
	c.subs[s] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.subs, s)
		c.mu.Unlock()
	}
}

// Reload reads the file now, whatever its stamp. It reports whether a new
// set was put in force (a file with the same content as the set in force
// changes nothing); on an error the last good set stays in force, and the
// error is also passed to OnError.
func (c *CRL) Reload() (bool, error) {
	return c.reload()
}

// Run polls the file until ctx ends, reloading it when its stamp changes.
func (c *CRL) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if c.changed() {
			_, _ = c.reload()
		}
	}
}

// changed reports whether the file's stamp differs from the last read's.
func (c *CRL) changed() bool {
	var st fileStamp
	fi, err := os.Stat(c.cfg.Path)
	if err != nil {
		st.missing = true
	} else {
		st = stampOf(fi)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return st != c.stamp
}

func (c *CRL) reload() (bool, error) {
	set, st, err := c.load()
	c.mu.Lock()
	c.stamp = st
	if err != nil {
		c.failures++
		c.mu.Unlock()
		if c.cfg.OnError != nil {
			c.cfg.OnError(err)
		}
		return false, err
	}
	if old := c.set.Load(); old != nil && old.sum == set.sum {
		c.mu.Unlock()
		return false, nil
	}
	c.set.Store(set)
	subs := make([]*crlSub, 0, len(c.subs))
	for s := range c.subs {
		subs = append(subs, s)
	}
	c.mu.Unlock()
	for _, s := range subs {
		s.f(set)
	}
	return true, nil
}

// load reads and parses the file; the stamp is taken before reading, so a
// write racing the read shows up as a changed stamp at the next poll.
func (c *CRL) load() (*CRLSet, fileStamp, error) {
	fi, err := os.Stat(c.cfg.Path)
	if err != nil {
		return nil, fileStamp{missing: true}, fmt.Errorf("mtls: CRL file: %w", err)
	}
	st := stampOf(fi)
	data, err := os.ReadFile(c.cfg.Path)
	if err != nil {
		return nil, st, fmt.Errorf("mtls: CRL file: %w", err)
	}
	set, err := newCRLSetFromFile(data, c.anchors())
	if err != nil {
		return nil, st, fmt.Errorf("%s: %w", c.cfg.Path, err)
	}
	return set, st, nil
}
