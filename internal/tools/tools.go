//go:build tools

// Package tools pins modules the build needs before any package imports them.
package tools

import (
	_ "github.com/vishvananda/netns"
	_ "go.uber.org/goleak"
	_ "go.yaml.in/yaml/v3"
	_ "golang.org/x/net/http2"
	_ "golang.org/x/net/http2/hpack"
	_ "golang.org/x/sync/errgroup"
	_ "golang.org/x/sys/unix"
)
