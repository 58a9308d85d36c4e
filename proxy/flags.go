package proxy

import (
	"errors"
	"net/http"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/metrics"
)

// Response flags (the access log's and metrics' word for why a connection
// failed) travel with the error that ended it: the step that knows what
// failed (a dial, a handshake, a policy) marks its error withFlags, and
// responseFlags reads them back when the connection ends. So a connection's
// end takes one error, and no caller passes flags next to it.

// flaggedError is an error marked with the response flags it ends a
// connection with.
type flaggedError struct {
	flags metrics.ResponseFlags
	err   error
}

func (e *flaggedError) Error() string { return e.err.Error() }
func (e *flaggedError) Unwrap() error { return e.err }

// withFlags marks err with flags; nil stays nil (a clean end has no flags).
func withFlags(flags metrics.ResponseFlags, err error) error {
	if err == nil {
		return nil
	}
	return &flaggedError{flags: flags, err: err}
}

// responseFlags maps the error a connection ended with to its response
// flags: the outermost mark withFlags put on it; else a refused CONNECT,
// by the HTTP status the peer answered (upstream, *hbone.StatusError) or
// this proxy answers (inbound, *inboundError): 401 is a policy's DENY,
// any other a CONNECT failure; else none (nil, or an ordinary end).
func responseFlags(err error) metrics.ResponseFlags {
	if err == nil {
		return metrics.FlagNone
	}
	if fe, ok := errors.AsType[*flaggedError](err); ok {
		return fe.flags
	}
	if se, ok := errors.AsType[*hbone.StatusError](err); ok {
		return statusFlags(se.Code)
	}
	if ie, ok := errors.AsType[*inboundError](err); ok {
		return statusFlags(ie.status)
	}
	return metrics.FlagNone
}

// statusFlags are the flags of a CONNECT refused with an HTTP status.
func statusFlags(status int) metrics.ResponseFlags {
	if status == http.StatusUnauthorized {
		return metrics.FlagDeny
	}
	return metrics.FlagConnect
}
