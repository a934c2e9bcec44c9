// kubelet-double plays the kubelet's side of the device plugin API
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) for one plugin, as a test
// tool of this project (tests/it/device_plugin.rs). It serves the
// Registration service on DIR/kubelet.sock and, once a plugin registers,
// does what a kubelet does first with it: GetDevicePluginOptions, the first
// ListAndWatch answer, and an Allocate of the first device listed. It
// prints what the plugin answered as one JSON line on stdout and exits 0;
// exit 1 with a message on stderr when that has not happened within
// --timeout seconds, or when the plugin answers with an error.
//
// Usage: kubelet-double --dir DIR [--timeout SECONDS]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type device struct {
	ID     string `json:"id"`
	Health string `json:"health"`
}

type mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly"`
}

type deviceSpec struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	Permissions   string `json:"permissions"`
}

type allocation struct {
	Envs        map[string]string `json:"envs"`
	Mounts      []mount           `json:"mounts"`
	Devices     []deviceSpec      `json:"devices"`
	Annotations map[string]string `json:"annotations"`
}

type options struct {
	PreStartRequired                bool `json:"preStartRequired"`
	GetPreferredAllocationAvailable bool `json:"getPreferredAllocationAvailable"`
}

// report is the one line printed on stdout.
type report struct {
	ResourceName string     `json:"resourceName"`
	Version      string     `json:"version"`
	Endpoint     string     `json:"endpoint"`
	Devices      []device   `json:"devices"`
	Allocate     allocation `json:"allocate"`
	Options      options    `json:"options"`
}

// registration is the kubelet's Registration service: it hands each
// request to the main goroutine and answers at once, as the kubelet does
// (it talks to the plugin only after Register has returned).
type registration struct {
	api.UnimplementedRegistrationServer
	requests chan *api.RegisterRequest
}

func (r *registration) Register(_ context.Context, req *api.RegisterRequest) (*api.Empty, error) {
	if req.Version != api.Version {
		return nil, fmt.Errorf("unsupported device plugin API version %q (want %q)", req.Version, api.Version)
	}
	if filepath.Base(req.Endpoint) != req.Endpoint {
		return nil, fmt.Errorf("endpoint %q is not a file name in the plugin directory", req.Endpoint)
	}
	select {
	case r.requests <- req:
	default: // a second registration: the first one is being served
	}
	return &api.Empty{}, nil
}

func main() {
	dir := flag.String("dir", "", "the device plugin directory (kubelet.sock and the plugin's endpoint)")
	timeout := flag.Float64("timeout", 60, "seconds to wait for a plugin to register and answer")
	flag.Parse()
	if *dir == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-double --dir DIR [--timeout SECONDS]")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*timeout*float64(time.Second)))
	defer cancel()
	r, err := run(ctx, *dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-double: %v\n", err)
		os.Exit(1)
	}
	line, err := json.Marshal(r)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-double: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(line))
}

// run serves DIR/kubelet.sock until one plugin has registered and answered.
func run(ctx context.Context, dir string) (*report, error) {
	socket := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(socket)
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	reg := &registration{requests: make(chan *api.RegisterRequest, 1)}
	api.RegisterRegistrationServer(server, reg)
	go func() { _ = server.Serve(lis) }()
	defer server.Stop()

	select {
	case req := <-reg.requests:
		return query(ctx, dir, req)
	case <-ctx.Done():
		return nil, errors.New("timed out waiting for a device plugin to register on " + socket)
	}
}

// query asks the registered plugin what a kubelet asks first.
func query(ctx context.Context, dir string, req *api.RegisterRequest) (*report, error) {
	endpoint := filepath.Join(dir, req.Endpoint)
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := api.NewDevicePluginClient(conn)
	step := func(what string, err error) error {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("timed out in %s on %s: %v", what, endpoint, err)
		}
		return fmt.Errorf("%s on %s: %v", what, endpoint, err)
	}

	opts, err := client.GetDevicePluginOptions(ctx, &api.Empty{})
	if err != nil {
		return nil, step("GetDevicePluginOptions", err)
	}
	stream, err := client.ListAndWatch(ctx, &api.Empty{})
	if err != nil {
		return nil, step("ListAndWatch", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, step("ListAndWatch", err)
	}
	r := &report{
		ResourceName: req.ResourceName,
		Version:      req.Version,
		Endpoint:     req.Endpoint,
		Devices:      []device{},
		Options: options{
			PreStartRequired:                opts.PreStartRequired,
			GetPreferredAllocationAvailable: opts.GetPreferredAllocationAvailable,
		},
	}
	for _, d := range first.Devices {
		r.Devices = append(r.Devices, device{ID: d.ID, Health: d.Health})
	}
	if len(r.Devices) == 0 {
		return nil, fmt.Errorf("the plugin on %s listed no devices", endpoint)
	}
	alloc, err := client.Allocate(ctx, &api.AllocateRequest{
		ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIDs: []string{r.Devices[0].ID}}},
	})
	if err != nil {
		return nil, step("Allocate", err)
	}
	if len(alloc.ContainerResponses) != 1 {
		return nil, fmt.Errorf("Allocate on %s: %d container responses for 1 request", endpoint, len(alloc.ContainerResponses))
	}
	r.Allocate = toAllocation(alloc.ContainerResponses[0])
	return r, nil
}

func toAllocation(c *api.ContainerAllocateResponse) allocation {
	a := allocation{
		Envs:        map[string]string{},
		Mounts:      []mount{},
		Devices:     []deviceSpec{},
		Annotations: map[string]string{},
	}
	for k, v := range c.Envs {
		a.Envs[k] = v
	}
	for k, v := range c.Annotations {
		a.Annotations[k] = v
	}
	for _, m := range c.Mounts {
		a.Mounts = append(a.Mounts, mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, d := range c.Devices {
		a.Devices = append(a.Devices, deviceSpec{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions})
	}
	return a
}
