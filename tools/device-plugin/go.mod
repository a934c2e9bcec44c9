module gpu-driver/device-plugin

go 1.23.0

require (
	google.golang.org/grpc v1.65.1
	k8s.io/kubelet v0.31.3
)

require (
	github.com/gogo/protobuf v1.3.2 // indirect
	golang.org/x/net v0.33.0 // indirect
	golang.org/x/sys v0.28.0 // indirect
	golang.org/x/text v0.21.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20240701130421-f6361c86f094 // indirect
	google.golang.org/protobuf v1.34.2 // indirect
)
