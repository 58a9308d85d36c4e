module github.com/ztunnel-go/ztunnel

go 1.26.0

require (
	github.com/vishvananda/netns v0.0.5
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/net v0.62.0
	golang.org/x/sync v0.25.0
	golang.org/x/sys v0.50.0
)

require golang.org/x/text v0.43.0 // indirect
