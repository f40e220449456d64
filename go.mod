module github.com/verbline/rdma

go 1.26.0

require golang.org/x/sys v0.50.0

require (
	github.com/klauspost/cpuid/v2 v2.4.2
	golang.org/x/net v0.62.0
	google.golang.org/grpc v1.85.0
)

require (
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
