package mtls

import (
	"cmp"
	"slices"

	"github.com/ztunnel-go/ztunnel/identity"
)

// CertState is one identity's certificate as ztunnel's /config_dump shows
// it: Initializing until its first fetch ends, Unavailable when there is
// no usable certificate and the last fetch failed (a certificate that
// expired while its renewal kept failing counts as none, as ztunnel drops
// it), else Available.
type CertState struct {
	Identity identity.Identity
	// Cert is the certificate in use; nil unless Available.
	Cert *WorkloadCert
	// Err is why it is Unavailable.
	Err error
}

// Names of the states, as ztunnel spells them.
const (
	CertInitializing = "Initializing"
	CertAvailable    = "Available"
	CertUnavailable  = "Unavailable"
)

// State is the state's name: "Initializing", "Available" or, as ztunnel
// writes it, "Unavailable: <error>".
func (c CertState) State() string {
	switch {
	case c.Cert != nil:
		return CertAvailable
	case c.Err != nil:
		return CertUnavailable + ": " + c.Err.Error()
	}
	return CertInitializing
}

// CertStates returns every identity asked for and not forgotten, sorted by
// identity, with its state.
func (s *Store) CertStates() []CertState {
	now := s.now()
	s.mu.Lock()
	out := make([]CertState, 0, len(s.entries))
	for _, e := range s.entries {
		st := CertState{Identity: e.id, Cert: e.cert, Err: e.lastErr}
		if st.Cert != nil && !now.Before(st.Cert.NotAfter) && st.Err != nil {
			st.Cert = nil // expired and not renewed
		}
		if st.Cert != nil {
			st.Err = nil // a renewal failed, the current one still serves
		}
		out = append(out, st)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b CertState) int { return cmp.Compare(a.Identity.String(), b.Identity.String()) })
	return out
}
