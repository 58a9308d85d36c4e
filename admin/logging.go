package admin

import (
	"fmt"
	"net/http"
)

// LogLevels is the live log filter /logging shows and changes.
// *logging.Levels (internal/logging) implements it.
type LogLevels interface {
	// String is the filter in RUST_LOG syntax.
	String() string
	// Set applies directives on top of the current filter.
	Set(directives string) error
	// Reset returns to the startup filter, then applies directives.
	Reset(directives string) error
}

const loggingHelp = `
usage: POST /logging                                  show the current filter
usage: POST /logging?level=<level>                    set the default level
usage: POST /logging?level=<target>=<level>,...       set targets' levels (<target>:<level> works too)
usage: POST /logging?reset[&level=...]                back to the startup filter (RUST_LOG), then apply level

levels: error, warn, info, debug, trace, off
targets: access, dns, xds::client, identity::manager, inpod::statemanager, proxy::pool, ... (prefix match; ztunnel::xds works too)
`

// logging serves ztunnel's /logging: POST with no parameter (or an empty
// level) shows the filter; ?level= changes it on top of the current one;
// ?reset starts from the startup filter. istioctl ztunnel-config log uses
// exactly this. Other methods get ztunnel's 405, GET included.
func (s *Server) logging(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	level := q.Get("level")
	_, reset := q["reset"]
	change := level != "" || reset
	if r.Method != http.MethodPost {
		plain(w, http.StatusMethodNotAllowed, "Invalid HTTP method\n "+loggingHelp)
		return
	}
	if s.cfg.Logging == nil {
		plain(w, http.StatusInternalServerError, "logging is not initialized\n")
		return
	}
	if change {
		var err error
		if reset {
			err = s.cfg.Logging.Reset(level)
		} else {
			err = s.cfg.Logging.Set(level)
		}
		if err != nil {
			plain(w, http.StatusBadRequest, fmt.Sprintf("invalid level %q: %v\n%s", level, err, loggingHelp))
			return
		}
		s.cfg.Logger.Info("log filter changed", "filter", s.cfg.Logging.String(), "scope", "admin")
	}
	plain(w, http.StatusOK, "current log level is "+s.cfg.Logging.String()+"\n")
}

func plain(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	w.Write([]byte(body))
}
