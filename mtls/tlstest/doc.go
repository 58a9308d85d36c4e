// Package tlstest is a test kit for code that uses mtls: a built-in CA per
// test and workload certificates issued through the real caclient path (key,
// CSR, signing, mtls.ParseChain). Imports (of ours): identity, mtls and
// mtls/caclient. Imported by: tests.
package tlstest
