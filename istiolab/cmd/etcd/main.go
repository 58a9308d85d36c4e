// Command etcd is upstream etcd's server, unmodified: etcd's own main
// package is the root of go.etcd.io/etcd/v3, a module that points its parts
// at its own tree with replace directives (which a dependency's go.mod
// cannot carry), and all it does is this call.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
