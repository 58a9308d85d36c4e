//go:build tools

// Package tools pins modules the build needs before any package imports
// them, and the code generators `make generate` runs with `go run`.
package tools

import (
	_ "github.com/HdrHistogram/hdrhistogram-go"
	_ "github.com/bufbuild/protocompile"
	_ "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	_ "github.com/google/pprof/profile"
	_ "github.com/klauspost/compress/gzip"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/vishvananda/netns"
	_ "go.uber.org/goleak"
	_ "go.yaml.in/yaml/v3"
	_ "golang.org/x/net/http2"
	_ "golang.org/x/net/http2/hpack"
	_ "golang.org/x/sync/errgroup"
	_ "golang.org/x/sys/unix"
	_ "gonum.org/v1/plot"
	_ "google.golang.org/grpc"
	_ "google.golang.org/protobuf/cmd/protoc-gen-go"
	_ "google.golang.org/protobuf/proto"
)
