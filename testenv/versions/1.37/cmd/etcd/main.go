// Command etcd is upstream etcd's own entry point, built at the version that
// k8s.io/kubernetes pins, so the test control plane needs no prebuilt download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
