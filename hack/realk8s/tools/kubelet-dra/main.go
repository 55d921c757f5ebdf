// Command kubelet-dra runs the kubelet's own DRA code outside a kubelet: the real
// pkg/kubelet/cm/dra Manager (claim cache and checkpoint, plugin calls, slice wiping, the
// reconcile loop) and the real plugin manager watching <root-dir>/plugins_registry, with a
// node kubeconfig, so that tests drive a DRA driver exactly as a kubelet would.
//
// One JSON request per line on stdin, one JSON answer line each on stdout:
//
//	{"op":"prepare","pod":POD}                    -> {} or {"error":"..."}
//	{"op":"resources","pod":POD,"container":NAME} -> {"cdiDevices":["vendor/class=name",...]}
//	{"op":"unprepare","pod":POD}                  -> {} or {"error":"..."}
//	{"op":"active","pods":[POD,...]}              -> {} (what the reconcile loop sees running;
//	                                                 it unprepares nothing before the first)
//	{"op":"plugins"}                              -> {"registered":[{"driver":NAME,"endpoint":PATH,
//	                                                  "service":"v1.DRAPlugin","connected":BOOL},...]}
//	{"op":"plugins","drivers":[NAME,...]}         -> {"plugins":{"NAME":true|false}}
//	{"op":"health","pod":POD}                     -> {"health":{"CONTAINER":[ResourceStatus,...]},
//	                                                  "notified":["POD UID",...]}
//
// "plugins" without drivers lists every instance the DRA plugin manager holds (the kubelet's
// own view: a refused or deregistered instance is absent), sorted by driver, each driver's in
// registration order (the kubelet calls the newest connected one); with drivers it says
// whether GetPlugin finds each (what a prepare for that driver would see).
// "health" is what the kubelet writes into each container's status.allocatedResourcesStatus
// (the manager's UpdateAllocatedResourcesStatus over the health its WatchResources streams
// reported; needs --feature-gates=ResourceHealthStatus=true where that is not the default),
// and "notified" the pods the manager has asked, since the last "health", to have their status
// synced again (its Updates channel, which the kubelet's sync loop reads).
// POD is a v1 Pod as the API server returns it. Restarting the program on the same --root-dir
// is a kubelet restart: the Manager reloads its checkpoint from there.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginregistration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"

	// Registers the Kubernetes feature gates with their defaults at this version.
	_ "k8s.io/kubernetes/pkg/features"
)

type request struct {
	Op        string    `json:"op"`
	Pod       *v1.Pod   `json:"pod,omitempty"`
	Pods      []*v1.Pod `json:"pods,omitempty"`
	Container string    `json:"container,omitempty"`
	Drivers   []string  `json:"drivers,omitempty"`
}

// instance is one registered plugin instance, as the DRA plugin manager holds it.
type instance struct {
	Driver    string `json:"driver"`
	Endpoint  string `json:"endpoint"`
	Service   string `json:"service"`
	Connected bool   `json:"connected"`
}

type answer struct {
	Error      string                         `json:"error,omitempty"`
	CDIDevices []string                       `json:"cdiDevices,omitempty"`
	Plugins    map[string]bool                `json:"plugins,omitempty"`
	Registered *[]instance                    `json:"registered,omitempty"`
	Health     map[string][]v1.ResourceStatus `json:"health,omitempty"`
	Notified   []string                       `json:"notified,omitempty"`
}

// sources: the kubelet's pod sources count as complete once the test has said which pods
// run ("active"), as a kubelet's do once it has heard from the API server. Until then the
// reconcile loop leaves checkpointed claims alone, which is what a restarted kubelet does.
type sources struct{ ready atomic.Bool }

func (*sources) AddSource(string) {}
func (s *sources) AllReady() bool { return s.ready.Load() }

type harness struct {
	manager  *dra.Manager
	sources  *sources
	mu       sync.Mutex
	active   []*v1.Pod
	notified []string // pod UIDs from the manager's Updates channel, until the next "health"
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "node kubeconfig (the kubelet's identity)")
	nodeName := flag.String("node-name", "", "this node's name")
	rootDir := flag.String("root-dir", "", "the kubelet's root dir (plugins_registry, state)")
	gates := flag.String("feature-gates", "", "feature gates, as the kubelet's --feature-gates")
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	flag.Parse()
	if err := run(*kubeconfig, *nodeName, *rootDir, *gates); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-dra:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, nodeName, rootDir, gates string) error {
	if kubeconfig == "" || nodeName == "" || rootDir == "" {
		return errors.New("--kubeconfig, --node-name and --root-dir are required")
	}
	if gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(gates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	// The kubelet's own client limits (kubeAPIQPS 50, kubeAPIBurst 100 in the v1beta1
	// KubeletConfiguration defaults), not client-go's 5/10: with those every claim GET past
	// the tenth waits for the rate limiter, and latency figures measure the limiter.
	config.QPS, config.Burst = 50, 100
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	registry := filepath.Join(rootDir, "plugins_registry")
	if err := os.MkdirAll(registry, 0o750); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := klog.FromContext(ctx)
	manager, err := dra.NewManager(logger, client, rootDir)
	if err != nil {
		return fmt.Errorf("DRA manager: %w", err)
	}
	h := &harness{manager: manager, sources: &sources{}}
	getNode := nodeGetter(func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	})
	if err := manager.Start(ctx, h.activePods, getNode, h.sources); err != nil {
		return fmt.Errorf("DRA manager start: %w", err)
	}
	plugins := pluginmanager.NewPluginManager(registry, record.NewFakeRecorder(100))
	plugins.AddHandler(pluginregistration.DRAPlugin, manager.GetWatcherHandler())
	go plugins.Run(ctx, &sources{}, ctx.Done()) // the plugin manager never waits for pods
	go h.collectUpdates(ctx)
	return h.serve(ctx)
}

// nodeGetter adapts to dra.GetNodeFunc, which takes a context since 1.37 and none before.
func nodeGetter(get func(context.Context) (*v1.Node, error)) dra.GetNodeFunc {
	t := reflect.TypeOf(dra.GetNodeFunc(nil))
	fn := reflect.MakeFunc(t, func(args []reflect.Value) []reflect.Value {
		ctx := context.Background()
		if len(args) == 1 {
			ctx = args[0].Interface().(context.Context)
		}
		node, err := get(ctx)
		errValue := reflect.Zero(reflect.TypeOf((*error)(nil)).Elem())
		if err != nil {
			errValue = reflect.ValueOf(&err).Elem()
		}
		return []reflect.Value{reflect.ValueOf(node), errValue}
	})
	return fn.Interface().(dra.GetNodeFunc)
}

// collectUpdates plays the kubelet's sync loop reading the manager's Updates: it remembers
// which pods the manager wants resynced (the channel is buffered and drops when full).
func (h *harness) collectUpdates(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case update := <-h.manager.Updates():
			h.mu.Lock()
			h.notified = append(h.notified, update.PodUIDs...)
			h.mu.Unlock()
		}
	}
}

// allocatedResourcesStatus fills status the way the kubelet's status manager has the DRA
// manager fill it. The method takes a logger first since 1.37 and none before.
func (h *harness) allocatedResourcesStatus(pod *v1.Pod, status *v1.PodStatus) error {
	method := reflect.ValueOf(h.manager).MethodByName("UpdateAllocatedResourcesStatus")
	if !method.IsValid() {
		return errors.New("this DRA manager has no UpdateAllocatedResourcesStatus")
	}
	args := []reflect.Value{reflect.ValueOf(pod), reflect.ValueOf(status)}
	if method.Type().NumIn() == 3 {
		args = append([]reflect.Value{reflect.ValueOf(klog.Background())}, args...)
	}
	method.Call(args)
	return nil
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*v1.Pod(nil), h.active...)
}

func (h *harness) serve(ctx context.Context) error {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var ans answer
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			ans.Error = "request: " + err.Error()
		} else {
			ans = h.handle(ctx, req)
		}
		if err := out.Encode(ans); err != nil {
			return err
		}
	}
	return in.Err()
}

func (h *harness) handle(ctx context.Context, req request) answer {
	needPod := func() error {
		if req.Pod == nil {
			return fmt.Errorf("op %q needs a pod", req.Op)
		}
		return nil
	}
	switch req.Op {
	case "prepare":
		if err := needPod(); err != nil {
			return answer{Error: err.Error()}
		}
		if err := h.manager.PrepareResources(ctx, req.Pod); err != nil {
			return answer{Error: err.Error()}
		}
	case "unprepare":
		if err := needPod(); err != nil {
			return answer{Error: err.Error()}
		}
		if err := h.manager.UnprepareResources(ctx, req.Pod); err != nil {
			return answer{Error: err.Error()}
		}
	case "resources":
		if err := needPod(); err != nil {
			return answer{Error: err.Error()}
		}
		for i := range req.Pod.Spec.Containers {
			container := &req.Pod.Spec.Containers[i]
			if container.Name != req.Container {
				continue
			}
			info, err := h.manager.GetResources(req.Pod, container)
			if err != nil {
				return answer{Error: err.Error()}
			}
			devices := []string{}
			for _, d := range info.CDIDevices {
				devices = append(devices, d.Name)
			}
			return answer{CDIDevices: devices}
		}
		return answer{Error: fmt.Sprintf("pod has no container %q", req.Container)}
	case "active":
		h.mu.Lock()
		h.active = req.Pods
		h.mu.Unlock()
		h.sources.ready.Store(true)
	case "plugins":
		plugins, ok := h.manager.GetWatcherHandler().(*draplugin.DRAPluginManager)
		if !ok {
			return answer{Error: "the DRA manager's plugin handler is not a DRAPluginManager"}
		}
		if req.Drivers == nil {
			registered, err := instances(plugins)
			if err != nil {
				return answer{Error: err.Error()}
			}
			return answer{Registered: &registered}
		}
		found := map[string]bool{}
		for _, name := range req.Drivers {
			_, err := plugins.GetPlugin(name)
			found[name] = err == nil
		}
		return answer{Plugins: found}
	case "health":
		if err := needPod(); err != nil {
			return answer{Error: err.Error()}
		}
		status := req.Pod.Status.DeepCopy()
		status.ContainerStatuses = nil // the kubelet's fresh status: one entry per container
		for _, container := range req.Pod.Spec.Containers {
			status.ContainerStatuses = append(status.ContainerStatuses,
				v1.ContainerStatus{Name: container.Name})
		}
		if err := h.allocatedResourcesStatus(req.Pod, status); err != nil {
			return answer{Error: err.Error()}
		}
		health := map[string][]v1.ResourceStatus{}
		for _, container := range status.ContainerStatuses {
			health[container.Name] = append([]v1.ResourceStatus{},
				container.AllocatedResourcesStatus...)
		}
		h.mu.Lock()
		notified := h.notified
		h.notified = nil
		h.mu.Unlock()
		return answer{Health: health, Notified: notified}
	default:
		return answer{Error: fmt.Sprintf("unknown op %q", req.Op)}
	}
	return answer{}
}

// instances reads the DRA plugin manager's store under its own lock. The store is unexported
// (no accessor lists it in 1.35 or 1.37), so its fields are read by reflection: the same
// layout in both (mutex sync.RWMutex; store map[driver][]*monitoredPlugin, each embedding
// *DRAPlugin with endpoint and chosenService, and its own connected flag). A layout that
// differs is an error, never a guess.
func instances(pm *draplugin.DRAPluginManager) ([]instance, error) {
	v := reflect.ValueOf(pm).Elem()
	mutex, store := v.FieldByName("mutex"), v.FieldByName("store")
	if !mutex.IsValid() || mutex.Type() != reflect.TypeOf(sync.RWMutex{}) ||
		!store.IsValid() || store.Kind() != reflect.Map {
		return nil, errors.New("the DRAPluginManager's layout is not the one this harness reads")
	}
	lock := (*sync.RWMutex)(unsafe.Pointer(mutex.UnsafeAddr()))
	lock.RLock()
	defer lock.RUnlock()
	out := []instance{}
	for it := store.MapRange(); it.Next(); {
		plugins := it.Value()
		for i := 0; i < plugins.Len(); i++ {
			mp := plugins.Index(i).Elem()
			p := mp.FieldByName("DRAPlugin")
			connected := mp.FieldByName("connected")
			if p.Kind() != reflect.Pointer || connected.Kind() != reflect.Bool {
				return nil, errors.New("a monitoredPlugin's layout is not the one this harness reads")
			}
			p = p.Elem()
			endpoint, service := p.FieldByName("endpoint"), p.FieldByName("chosenService")
			if endpoint.Kind() != reflect.String || service.Kind() != reflect.String {
				return nil, errors.New("a DRAPlugin's layout is not the one this harness reads")
			}
			out = append(out, instance{Driver: it.Key().String(), Endpoint: endpoint.String(),
				Service: service.String(), Connected: connected.Bool()})
		}
	}
	// Map order is random; within a driver the slice is registration order.
	sort.SliceStable(out, func(i, j int) bool { return out[i].Driver < out[j].Driver })
	return out, nil
}
