module github.com/ztunnel-go/ztunnel/hbone/testdata/h2spec

go 1.26.0

require github.com/summerwind/h2spec v2.2.1+incompatible

require (
	github.com/fatih/color v1.19.0 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)
