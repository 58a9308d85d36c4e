package app

import (
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/ztunnel-go/ztunnel/admin"
)

// Build stamps, set by the linker: `make build` and the image pass
// ztunnel-go's version (the VERSION file) and the commit, both through
// scripts/ldflags.sh, as
//
//	-ldflags "-X github.com/ztunnel-go/ztunnel/internal/app.stampedVersion=v1.2.3
//	          -X github.com/ztunnel-go/ztunnel/internal/app.stampedRevision=<sha>"
//
// Empty in a plain `go build`: buildInfo then reports the module version
// or "dev", and the VCS revision go recorded. Only the linker writes them.
var (
	stampedVersion  string
	stampedRevision string
)

// stamp applies the linker's stamps to bi.
func stamp(bi admin.BuildInfo) admin.BuildInfo {
	if stampedVersion != "" {
		bi.Version = stampedVersion
	}
	if stampedRevision != "" {
		bi.GitRevision = stampedRevision
	}
	return bi
}

// logStart logs what ztunnel logs as it starts (main.rs, app.rs): the
// version, the effective configuration, and the mode. The configuration
// is the one /config_dump shows, in ztunnel's shape (configview.go), secrets
// left out.
func logStart(log *slog.Logger, cfg *Config, bi admin.BuildInfo) {
	log.Info(fmt.Sprintf("version: %s", formatBuildInfo(bi)))
	if b, err := json.Marshal(processView(cfg)); err == nil {
		log.Info("running with config: " + string(b))
	}
	if cfg.Mode == ModeShared {
		log.Info("shared proxy mode - in-pod mode enabled")
	} else {
		log.Info("proxy mode enabled")
	}
}

// formatBuildInfo writes bi as ztunnel's BuildInfo Display does.
func formatBuildInfo(bi admin.BuildInfo) string {
	return fmt.Sprintf("version.BuildInfo{Version:%q, GitRevision:%q, GoVersion:%q, BuildProfile:%q, BuildStatus:%q, IstioVersion:%q}",
		bi.Version, bi.GitRevision, bi.GoVersion, bi.BuildProfile, bi.BuildStatus, bi.IstioVersion)
}

// daemonBuildInfo is buildInfo with the Istio release the daemon stands in
// for (ISTIO_META_ISTIO_VERSION, "unknown" when unset, as ztunnel).
func daemonBuildInfo(cfg *Config) admin.BuildInfo {
	bi := buildInfo()
	bi.IstioVersion = cfg.IstioVersion
	if bi.IstioVersion == "" {
		bi.IstioVersion = "unknown"
	}
	return bi
}
