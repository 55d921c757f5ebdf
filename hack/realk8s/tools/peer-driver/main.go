// Command peer-driver is what a peer DRA driver is: a Go program on the upstream
// k8s.io/dynamic-resource-allocation kubeletplugin helper (registration, the DRA gRPC service,
// claim GETs, serialised calls) and its resourceslice controller, publishing the devices given
// to it and preparing claims the way kubernetes-sigs/dra-example-driver does: one CDI spec per
// claim written with the CDI library, and a checkpoint of prepared claims through the kubelet's
// checkpointmanager. It exists so `python -m hack.bench vs-upstream` can measure the agent and
// the Go helper under the same harness, in the same run.
//
// Flags: --kubeconfig --node-name --driver-name --kubelet-dir --cdi-dir --devices FILE
// (FILE: the JSON list `dra-agent discover -o json` prints; the devices of every slice are
// published as one pool named after the node). It prints "ready" on stdout once the slices are
// handed to the controller and the plugin is registered-for (the registration socket serves),
// and stops cleanly on SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager/checksum"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	cdiVendor      = "k8s.peer.dra-agent.io"
	cdiClass       = "claim"
	checkpointName = "checkpoint.json"
)

// prepared is one claim's devices as the kubelet was told them.
type prepared struct {
	Devices []kubeletplugin.Device `json:"devices"`
}

// checkpoint is the example driver's: prepared claims by UID, with the checksum the
// checkpointmanager verifies on read.
type checkpoint struct {
	Claims   map[types.UID]prepared `json:"claims"`
	Checksum checksum.Checksum      `json:"checksum"`
}

func (c *checkpoint) MarshalCheckpoint() ([]byte, error) {
	c.Checksum = 0
	c.Checksum = checksum.New(c.Claims)
	return json.Marshal(c)
}

func (c *checkpoint) UnmarshalCheckpoint(data []byte) error { return json.Unmarshal(data, c) }

func (c *checkpoint) VerifyChecksum() error { return c.Checksum.Verify(c.Claims) }

type driver struct {
	name    string
	pool    string
	devices map[string]bool
	cdi     *cdiapi.Cache
	cpm     checkpointmanager.CheckpointManager
	mu      sync.Mutex
}

func (d *driver) load() (*checkpoint, error) {
	cp := &checkpoint{Claims: map[types.UID]prepared{}}
	if err := d.cpm.GetCheckpoint(checkpointName, cp); err != nil {
		return nil, err
	}
	return cp, nil
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim,
) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cp, err := d.load()
	if err != nil {
		return nil, fmt.Errorf("reading the checkpoint: %w", err)
	}
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		if done, ok := cp.Claims[claim.UID]; ok { // a repeat: the same answer
			out[claim.UID] = kubeletplugin.PrepareResult{Devices: done.Devices}
			continue
		}
		devices, err := d.prepare(claim)
		if err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		cp.Claims[claim.UID] = prepared{Devices: devices}
		if err := d.cpm.CreateCheckpoint(checkpointName, cp); err != nil {
			delete(cp.Claims, claim.UID)
			out[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("checkpoint: %w", err)}
			continue
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return out, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if claim.Status.Allocation == nil {
		return nil, errors.New("claim not allocated")
	}
	spec := &cdispec.Spec{Kind: cdiVendor + "/" + cdiClass}
	var devices []kubeletplugin.Device
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != d.name {
			continue
		}
		if result.Pool != d.pool || !d.devices[result.Device] {
			return nil, fmt.Errorf("device %s/%s does not exist here", result.Pool, result.Device)
		}
		name := fmt.Sprintf("%s-%s", claim.UID, result.Device)
		env := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(result.Device))
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name: name,
			ContainerEdits: cdispec.ContainerEdits{Env: []string{
				"DRA_AGENT_DEVICE_" + env + "=" + result.Device,
				"DRA_AGENT_CLAIM_UID=" + string(claim.UID),
			}},
		})
		devices = append(devices, kubeletplugin.Device{
			Requests: []string{result.Request}, PoolName: result.Pool,
			DeviceName: result.Device, CDIDeviceIDs: []string{parser.QualifiedName(cdiVendor, cdiClass, name)},
		})
	}
	if len(spec.Devices) > 0 {
		version, err := cdiapi.MinimumRequiredVersion(spec)
		if err != nil {
			return nil, err
		}
		spec.Version = version
		if err := d.cdi.WriteSpec(spec, specName(claim.UID)); err != nil {
			return nil, fmt.Errorf("CDI spec: %w", err)
		}
	}
	return devices, nil
}

func specName(uid types.UID) string {
	return cdiapi.GenerateTransientSpecName(cdiVendor, cdiClass, string(uid))
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject,
) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cp, err := d.load()
	if err != nil {
		return nil, fmt.Errorf("reading the checkpoint: %w", err)
	}
	out := map[types.UID]error{}
	for _, claim := range claims {
		if _, ok := cp.Claims[claim.UID]; !ok {
			out[claim.UID] = nil
			continue
		}
		if err := d.cdi.RemoveSpec(specName(claim.UID)); err != nil && !os.IsNotExist(err) {
			out[claim.UID] = err
			continue
		}
		delete(cp.Claims, claim.UID)
		out[claim.UID] = d.cpm.CreateCheckpoint(checkpointName, cp)
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

// WatchHealthStatus: the example driver reports no health; neither does this peer (the
// benchmark compares prepare and publishing, and the helper then serves no stream).
func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// slice is the part of a ResourceSlice this program reads from `discover -o json`.
type slice struct {
	Spec struct {
		Devices []resourceapi.Device `json:"devices"`
	} `json:"spec"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the node's identity")
	nodeName := flag.String("node-name", "", "node name")
	driverName := flag.String("driver-name", "peer.dra-agent.io", "DRA driver name")
	kubeletDir := flag.String("kubelet-dir", "/var/lib/kubelet", "the kubelet's root dir")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "CDI spec directory")
	devicesFile := flag.String("devices", "", "`dra-agent discover -o json` output")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*kubeconfig, *nodeName, *driverName, *kubeletDir, *cdiDir, *devicesFile); err != nil {
		fmt.Fprintln(os.Stderr, "peer-driver:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, nodeName, driverName, kubeletDir, cdiDir, devicesFile string) error {
	raw, err := os.ReadFile(devicesFile)
	if err != nil {
		return err
	}
	var slices []slice
	if err := json.Unmarshal(raw, &slices); err != nil {
		return fmt.Errorf("%s: %w", devicesFile, err)
	}
	var devices []resourceapi.Device
	known := map[string]bool{}
	for _, s := range slices {
		for _, dev := range s.Spec.Devices {
			devices = append(devices, dev)
			known[dev.Name] = true
		}
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	pluginDir := filepath.Join(kubeletDir, "plugins", driverName)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	cpm, err := checkpointmanager.NewCheckpointManager(pluginDir)
	if err != nil {
		return err
	}
	d := &driver{name: driverName, pool: nodeName, devices: known, cpm: cpm}
	if _, err := d.load(); err != nil { // first start: an empty checkpoint
		if err := cpm.CreateCheckpoint(checkpointName, &checkpoint{Claims: map[types.UID]prepared{}}); err != nil {
			return err
		}
	}
	if d.cdi, err = cdiapi.NewCache(cdiapi.WithSpecDirs(cdiDir), cdiapi.WithAutoRefresh(false)); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client), kubeletplugin.NodeName(nodeName),
		kubeletplugin.DriverName(driverName), kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(kubeletDir, "plugins_registry")))
	if err != nil {
		return err
	}
	defer helper.Stop()
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return err
	}
	fmt.Println("ready")
	<-ctx.Done()
	return nil
}
