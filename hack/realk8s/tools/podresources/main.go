// Command podresources asks a kubelet's PodResources API (v1, the socket monitoring agents
// read) what each Pod was given, and prints the answer as JSON: `list` (every Pod) or
// `get NAMESPACE POD`. The client is the kubelet's own (pkg/kubelet/apis/podresources).
//
//	podresources [--socket PATH] list
//	podresources [--socket PATH] get NAMESPACE POD
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
)

func main() {
	socket := flag.String("socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's PodResources socket")
	flag.Parse()
	if err := run(*socket, flag.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "podresources: %v\n", err)
		os.Exit(1)
	}
}

func run(socket string, args []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, conn, err := podresources.GetV1Client(ctx, "unix://"+socket, 10*time.Second, 16*1024*1024)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	var answer any
	switch {
	case len(args) == 1 && args[0] == "list":
		answer, err = client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	case len(args) == 3 && args[0] == "get":
		answer, err = client.Get(ctx, &podresourcesapi.GetPodResourcesRequest{PodNamespace: args[1], PodName: args[2]})
	default:
		return fmt.Errorf("usage: podresources [--socket PATH] list | get NAMESPACE POD")
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(answer)
}
