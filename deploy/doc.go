// Package deploy holds what runs ztunnel-go in Kubernetes: ztunnel.yaml,
// the DaemonSet equivalent to Istio's ztunnel Helm chart, and Dockerfile,
// the image. Its only Go code is the test that checks the manifest against
// the daemon's own configuration parser (internal/app.ParseEnv), so that
// every environment variable the chart sets is one the daemon reads.
//
// Imports (of ours): nothing of ours. Imported by: nothing.
package deploy
