// Command peer-slices is the upstream k8s.io/dynamic-resource-allocation resourceslice
// controller alone, publishing the devices it is told for one node, so that
// `python -m hack.bench vs-upstream` can time a publish of N devices and count its API requests
// beside the agent's own slice controller (agent/slices) doing the same.
//
// Flags: --kubeconfig --node-name --driver-name --kube-api-qps --kube-api-burst
//
// It starts the controller with the Node as the slices' owner and no devices, then prints
// "ready". The Node's UID is left to the controller, which looks it up at its first write, as
// it does under the kubeletplugin helper when the driver gives no NodeUID (the example driver
// gives none). Each line on stdin is then one of:
//
//	FILE   a JSON list of v1 Devices: they become the node's one pool, 128 devices a slice
//	       (the v1 limit), in the given order; an empty list removes the pool's slices
//	stats  prints the controller's own counts: {"creates":N,"updates":N,"deletes":N}
//
// and is answered by one line on stdout ("updated" or the counts). It stops on SIGTERM or at
// the end of stdin.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// perSlice is the v1 API's limit of devices in one ResourceSlice (without taints, counters
// or list attributes): the agent's chunking closes its slices there too.
const perSlice = 128

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the node's identity")
	nodeName := flag.String("node-name", "", "node name (the pool and the slices' owner)")
	driverName := flag.String("driver-name", "peer.dra-agent.io", "DRA driver name")
	// client-go's own defaults (5, 10) would make a 2,048-device publish (16 creates) a
	// rate-limiter figure: the benchmark passes the kubelet's (50, 100), as for peer-driver.
	qps := flag.Float64("kube-api-qps", 5, "API client queries per second")
	burst := flag.Int("kube-api-burst", 10, "API client burst")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*kubeconfig, *nodeName, *driverName, float32(*qps), *burst); err != nil {
		fmt.Fprintln(os.Stderr, "peer-slices:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, nodeName, driverName string, qps float32, burst int) error {
	if nodeName == "" {
		return fmt.Errorf("--node-name is required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	config.QPS, config.Burst = qps, burst
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	controller, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: driverName,
		KubeClient: client,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: nodeName},
	})
	if err != nil {
		return err
	}
	defer controller.Stop()
	fmt.Println("ready")

	lines := make(chan string)
	go func() {
		defer close(lines)
		scanner := bufio.NewScanner(os.Stdin)
		for scanner.Scan() {
			lines <- strings.TrimSpace(scanner.Text())
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case line, ok := <-lines:
			if !ok {
				return nil
			}
			if err := command(controller, nodeName, line); err != nil {
				return err
			}
		}
	}
}

// command answers one stdin line (see the package comment) with one stdout line.
func command(controller *resourceslice.Controller, nodeName, line string) error {
	if line == "stats" {
		stats := controller.GetStats()
		out, err := json.Marshal(map[string]int64{
			"creates": stats.NumCreates, "updates": stats.NumUpdates, "deletes": stats.NumDeletes})
		if err != nil {
			return err
		}
		fmt.Println(string(out))
		return nil
	}
	raw, err := os.ReadFile(line)
	if err != nil {
		return err
	}
	var devices []resourceapi.Device
	if err := json.Unmarshal(raw, &devices); err != nil {
		return fmt.Errorf("%s: %w", line, err)
	}
	resources := &resourceslice.DriverResources{}
	if len(devices) > 0 {
		var slices []resourceslice.Slice
		for start := 0; start < len(devices); start += perSlice {
			end := min(start+perSlice, len(devices))
			slices = append(slices, resourceslice.Slice{Devices: devices[start:end]})
		}
		resources.Pools = map[string]resourceslice.Pool{nodeName: {Slices: slices}}
	}
	controller.Update(resources)
	fmt.Println("updated")
	return nil
}
