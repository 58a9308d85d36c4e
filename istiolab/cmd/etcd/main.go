// Command etcd is upstream etcd's server (go.etcd.io/etcd/server/v3/etcdmain),
// unmodified: etcd's own main lives in a module that is not published for
// use as a dependency, so this is the whole of it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
