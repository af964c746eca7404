// fake-kubelet: the device-plugin side of a kubelet, and nothing else, for running
// NVIDIA's device plugin without a node (testenv/deviceplugin/README.md).
//
// It serves the Registration service (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1)
// on <dir>/kubelet.sock. For each plugin that registers it does what the kubelet's
// device manager does next: dials <dir>/<endpoint>, asks GetDevicePluginOptions and
// calls ListAndWatch, and prints every list the plugin streams as one JSON line on
// stdout:
//
//	{"time":"...","resource":"nvidia.com/gpu","devices":[{"id":"GPU-...","health":"Healthy"}, ...]}
//
// With -allocate N it then asks, once, what a pod of N GPUs would get: the plugin's
// GetPreferredAllocation among the Healthy devices of the first list, and Allocate of
// those, each printed as a JSON line ({"preferred": [...]}, {"allocated": {...}}).
//
// Its own log goes to stderr. It exits on SIGINT/SIGTERM, or after -exit-after when
// that is set.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type device struct {
	ID     string `json:"id"`
	Health string `json:"health"`
}

type update struct {
	Time     string   `json:"time"`
	Resource string   `json:"resource"`
	Devices  []device `json:"devices"`
}

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	dir      string
	ctx      context.Context
	out      *json.Encoder
	allocate int
}

func (r *registration) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	log.Printf("Register: resource %s, endpoint %s, version %s, options %+v",
		req.ResourceName, req.Endpoint, req.Version, req.Options)
	// The kubelet answers first and connects afterwards: the plugin is still inside
	// its Register call, and starts its health checks only once it returns.
	go r.watch(req.ResourceName, filepath.Join(r.dir, req.Endpoint))
	return &pluginapi.Empty{}, nil
}

func (r *registration) watch(resource, socket string) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Printf("%s: dial %s: %v", resource, socket, err)
		return
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	options, err := client.GetDevicePluginOptions(r.ctx, &pluginapi.Empty{})
	if err != nil {
		log.Printf("%s: GetDevicePluginOptions: %v", resource, err)
		return
	}
	log.Printf("%s: GetDevicePluginOptions: %+v", resource, options)
	stream, err := client.ListAndWatch(r.ctx, &pluginapi.Empty{})
	if err != nil {
		log.Printf("%s: ListAndWatch: %v", resource, err)
		return
	}
	allocated := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			log.Printf("%s: ListAndWatch ended: %v", resource, err)
			return
		}
		u := update{Time: time.Now().UTC().Format(time.RFC3339Nano), Resource: resource}
		for _, d := range resp.Devices {
			u.Devices = append(u.Devices, device{ID: d.ID, Health: d.Health})
		}
		sort.Slice(u.Devices, func(i, j int) bool { return u.Devices[i].ID < u.Devices[j].ID })
		if err := r.out.Encode(u); err != nil {
			log.Printf("write: %v", err)
		}
		if r.allocate > 0 && !allocated {
			allocated = true
			r.allocateOnce(client, resource, u.Devices)
		}
	}
}

// allocateOnce does what the kubelet does for a pod asking for r.allocate devices.
func (r *registration) allocateOnce(client pluginapi.DevicePluginClient, resource string, devices []device) {
	var healthy []string
	for _, d := range devices {
		if d.Health == pluginapi.Healthy {
			healthy = append(healthy, d.ID)
		}
	}
	preferred, err := client.GetPreferredAllocation(r.ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: healthy,
			AllocationSize:     int32(r.allocate),
		}},
	})
	if err != nil {
		log.Printf("%s: GetPreferredAllocation: %v", resource, err)
		return
	}
	ids := preferred.ContainerResponses[0].DeviceIDs
	_ = r.out.Encode(map[string]any{"resource": resource, "preferred": ids})
	allocated, err := client.Allocate(r.ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
	})
	if err != nil {
		log.Printf("%s: Allocate: %v", resource, err)
		return
	}
	_ = r.out.Encode(map[string]any{"resource": resource, "allocated": allocated.ContainerResponses[0]})
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the device-plugin directory (kubelet.sock is served there)")
	exitAfter := flag.Duration("exit-after", 0, "exit after this long (0: on a signal only)")
	allocate := flag.Int("allocate", 0, "after the first list, ask for a preferred allocation of this many devices and allocate it (0: never)")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("fake-kubelet: ")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *exitAfter > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *exitAfter)
		defer cancel()
	}

	socket := filepath.Join(*dir, "kubelet.sock")
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("listen on %s: %v", socket, err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(server, &registration{dir: *dir, ctx: ctx, out: json.NewEncoder(os.Stdout), allocate: *allocate})
	go func() {
		<-ctx.Done()
		server.Stop()
	}()
	log.Printf("serving Registration on %s", socket)
	if err := server.Serve(listener); err != nil {
		log.Printf("serve: %v", err)
	}
	_ = os.Remove(socket)
}
