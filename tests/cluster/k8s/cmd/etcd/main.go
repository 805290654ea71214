// Command etcd is the etcd server, built from the etcd version that
// k8s.io/kubernetes itself requires (see ../../go.mod).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
