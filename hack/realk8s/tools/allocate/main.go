// Command allocate runs the scheduler's own DRA allocator (k8s.io/dynamic-resource-allocation
// structured, with the features kube-scheduler derives from its feature gates at this
// Kubernetes version) for the claims of one pod on one node.
//
// Input, one JSON document on stdin:
//
//	{"node": NODE, "claims": [...], "deviceClasses": [...], "resourceSlices": [...],
//	 "allocatedDevices": [{"driver": D, "pool": P, "device": N}, ...]}
//
// NODE is a v1 Node object or just its name. Output, one JSON line on stdout:
// {"allocations": {"<claim uid>": AllocationResult}} when every claim fits, or
// {"unschedulable": true, "error": "..."} when they do not. Bad input or an allocator error
// exits 1 with {"error": "..."}.
//
// Flags: --feature-gates (as kube-scheduler's); --lines: JSON lines, one input document a line
// and one output line for each, in order (a bad line answers {"error": "..."} and the rest go
// on), so that many cases pay for one process start.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	// Registers the Kubernetes feature gates with their defaults at this version.
	_ "k8s.io/kubernetes/pkg/features"
)

type input struct {
	Node             json.RawMessage              `json:"node"`
	Claims           []*resourceapi.ResourceClaim `json:"claims"`
	DeviceClasses    []*resourceapi.DeviceClass   `json:"deviceClasses"`
	ResourceSlices   []*resourceapi.ResourceSlice `json:"resourceSlices"`
	AllocatedDevices []deviceID                   `json:"allocatedDevices"`
}

// deviceID is one device another claim holds; a share of a device also names its shareID
// and consumedCapacity, which the scheduler's claim tracker adds to the allocated state (the
// device stays allocatable for further shares until its capacity is used up).
type deviceID struct {
	Driver           string                                          `json:"driver"`
	Pool             string                                          `json:"pool"`
	Device           string                                          `json:"device"`
	ShareID          *types.UID                                      `json:"shareID,omitempty"`
	ConsumedCapacity map[resourceapi.QualifiedName]resource.Quantity `json:"consumedCapacity,omitempty"`
}

type output struct {
	Allocations   map[string]resourceapi.AllocationResult `json:"allocations,omitempty"`
	Unschedulable bool                                    `json:"unschedulable,omitempty"`
	Error         string                                  `json:"error,omitempty"`
	// TimedOut: the search ran past --timeout, as the scheduler gives up on a node after its
	// DynamicResources filterTimeout; the answer is then "unschedulable" for that attempt.
	TimedOut bool `json:"timedOut,omitempty"`
}

type classes []*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) { return c, nil }

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, class := range c {
		if class.Name == name {
			return class, nil
		}
	}
	return nil, fmt.Errorf("device class %q not found", name)
}

func main() {
	gates := flag.String("feature-gates", "", "feature gates, as kube-scheduler's --feature-gates")
	lines := flag.Bool("lines", false, "JSON lines: one document a line, one answer a line")
	// kube-scheduler's DynamicResources filterTimeout default: an allocation search that takes
	// longer makes the node unschedulable for that attempt instead of blocking the scheduler.
	timeout := flag.Duration("timeout", 10*time.Second, "give up a search after this long (0: never)")
	flag.Parse()
	if *gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(*gates); err != nil {
			fmt.Fprintf(os.Stdout, "{\"error\":%q}\n", "--feature-gates: "+err.Error())
			os.Exit(1)
		}
	}
	if *lines {
		if err := runLines(os.Stdin, os.Stdout, *timeout); err != nil {
			fmt.Fprintln(os.Stderr, "allocate:", err)
			os.Exit(1)
		}
		return
	}
	out, err := run(os.Stdin, *timeout)
	if err != nil {
		out = output{Error: err.Error()}
	}
	if encErr := json.NewEncoder(os.Stdout).Encode(out); encErr != nil {
		fmt.Fprintln(os.Stderr, "allocate:", encErr)
		os.Exit(1)
	}
	if err != nil {
		os.Exit(1)
	}
}

// runLines answers each non-empty line of r with one line on w.
func runLines(r io.Reader, w io.Writer, timeout time.Duration) error {
	br := bufio.NewReaderSize(r, 1<<20)
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for {
		line, readErr := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			out, err := run(bytes.NewReader(line), timeout)
			if err != nil {
				out = output{Error: err.Error()}
			}
			if err := enc.Encode(out); err != nil {
				return err
			}
			if err := bw.Flush(); err != nil {
				return err
			}
		}
		if readErr == io.EOF {
			return nil
		}
		if readErr != nil {
			return readErr
		}
	}
}

func run(r io.Reader, timeout time.Duration) (output, error) {
	var in input
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return output{}, fmt.Errorf("input: %w", err)
	}
	node, err := parseNode(in.Node)
	if err != nil {
		return output{}, err
	}
	if len(in.Claims) == 0 {
		return output{}, errors.New("input: no claims")
	}
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	allocated := sets.New[structured.DeviceID]()
	shared := sets.New[structured.SharedDeviceID]()
	capacity := structured.NewConsumedCapacityCollection()
	for _, d := range in.AllocatedDevices {
		id := structured.MakeDeviceID(d.Driver, d.Pool, d.Device)
		switch {
		case d.ShareID == nil:
			allocated.Insert(id)
		case fts.EnableDRAConsumableCapacity:
			shared.Insert(structured.MakeSharedDeviceID(id, d.ShareID))
			capacity.Insert(structured.NewDeviceConsumedCapacity(id, d.ConsumedCapacity))
		default: // the gate off: the scheduler counts a share as the whole device
			allocated.Insert(id)
		}
	}
	state := structured.AllocatedState{
		AllocatedDevices:         allocated,
		AllocatedSharedDeviceIDs: shared,
		AggregatedCapacity:       capacity,
	}
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	allocator, err := structured.NewAllocator(ctx, dynamicresources.AllocatorFeatures(fts), state,
		classes(in.DeviceClasses), in.ResourceSlices, cel.NewCache(10, celFeatures(fts)))
	if err != nil {
		return output{}, fmt.Errorf("allocator: %w", err)
	}
	results, err := allocator.Allocate(ctx, node, in.Claims)
	if err != nil && ctx.Err() != nil {
		return output{Unschedulable: true, TimedOut: true,
			Error: fmt.Sprintf("timed out after %s: %v", timeout, err)}, nil
	}
	if err != nil {
		return output{}, fmt.Errorf("allocate: %w", err)
	}
	if results == nil {
		return output{Unschedulable: true, Error: "cannot allocate all claims"}, nil
	}
	out := output{Allocations: map[string]resourceapi.AllocationResult{}}
	for i, claim := range in.Claims {
		out.Allocations[string(claim.UID)] = results[i]
	}
	return out, nil
}

func parseNode(raw json.RawMessage) (*v1.Node, error) {
	var name string
	if err := json.Unmarshal(raw, &name); err == nil {
		if name == "" {
			return nil, errors.New("input: empty node name")
		}
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"kubernetes.io/hostname": name}}}, nil
	}
	var node v1.Node
	if err := json.Unmarshal(raw, &node); err != nil || node.Name == "" {
		return nil, fmt.Errorf("input: node must be a name or a Node with a name")
	}
	return &node, nil
}

// celFeatures mirrors what the scheduler's DynamicResources plugin gives its CEL cache. The
// fields differ between minors (1.37 added list-type attributes), so they are set by name.
func celFeatures(fts feature.Features) cel.Features {
	var out cel.Features
	set := func(field, from string) {
		dst := reflect.ValueOf(&out).Elem().FieldByName(field)
		src := reflect.ValueOf(fts).FieldByName(from)
		if dst.IsValid() && src.IsValid() {
			dst.SetBool(src.Bool())
		}
	}
	set("EnableConsumableCapacity", "EnableDRAConsumableCapacity")
	set("EnableListTypeAttributes", "EnableDRAListTypeAttributes")
	return out
}
