// Command h2spec runs the h2spec conformance suite
// (github.com/summerwind/h2spec, every section: generic, http2 and hpack)
// against one HTTP/2 server over TLS and writes one JSON line per test case.
//
// It exists because h2spec's own command has no flag for a client
// certificate, which the HBONE server requires; h2spec's library takes one
// (config.Config.CertFile), so the suite runs unchanged against the server's
// production mTLS configuration. The test cases, their frames and their
// verdicts are all h2spec's; this file only wires the configuration and
// reports the results. hbone's TestH2Spec builds and runs it.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/summerwind/h2spec/config"
	"github.com/summerwind/h2spec/generic"
	"github.com/summerwind/h2spec/hpack"
	"github.com/summerwind/h2spec/http2"
	"github.com/summerwind/h2spec/spec"
)

// result is one test case's outcome: ID is h2spec's own ("http2/5.1.1/2",
// as its -h2spec <section> arguments name cases).
type result struct {
	ID     string `json:"id"`
	Desc   string `json:"desc"`
	Result string `json:"result"` // passed, failed or skipped
	Error  string `json:"error,omitempty"`
}

func main() {
	host := flag.String("host", "127.0.0.1", "server host")
	port := flag.Int("port", 0, "server port")
	cert := flag.String("cert", "", "client certificate chain (PEM)")
	key := flag.String("key", "", "client private key (PEM)")
	timeout := flag.Duration("timeout", 2*time.Second, "how long a case waits for the server's answer")
	strict := flag.Bool("strict", false, "also run h2spec's strict cases (SHOULD-level)")
	out := flag.String("out", "", "file for the JSON lines of results (required)")
	flag.Parse()
	if *port == 0 || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: h2spec -port N -out FILE [-cert chain.pem -key key.pem] [sections...]")
		os.Exit(2)
	}
	c := &config.Config{
		Host:         *host,
		Port:         *port,
		Path:         "/",
		Timeout:      *timeout,
		MaxHeaderLen: 4000, // h2spec's default
		Strict:       *strict,
		TLS:          true,
		Insecure:     true, // the server's certificate is a SPIFFE one, without the host's name
		CertFile:     *cert,
		CertKeyFile:  *key,
		Sections:     flag.Args(),
	}
	f, err := os.Create(*out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	enc := json.NewEncoder(f)
	for _, g := range []*spec.TestGroup{generic.Spec(), http2.Spec(), hpack.Spec()} {
		g.Test(c)
		if err := report(enc, g); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := f.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// report writes the results of g's cases that ran, then those of its
// subgroups, in h2spec's order.
func report(enc *json.Encoder, g *spec.TestGroup) error {
	for i, tc := range append(g.Tests, g.StrictTests...) {
		tr := tc.Result
		if tr == nil {
			continue // not selected, or strict without -strict
		}
		r := result{ID: fmt.Sprintf("%s/%d", g.ID(), i+1), Desc: tc.Desc, Result: "passed"}
		switch {
		case tr.Skipped:
			r.Result = "skipped"
		case tr.Failed:
			r.Result = "failed"
			r.Error = tr.Error.Error()
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	for _, sg := range g.Groups {
		if err := report(enc, sg); err != nil {
			return err
		}
	}
	return nil
}
