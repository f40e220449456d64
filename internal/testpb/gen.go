// Package testpb is the Echo service grpcrdma's tests and rdmabench's gRPC
// cases serve: one method of each kind (unary, client-, server- and
// bidi-streaming). The generated files are checked in; regenerate them
// with `go generate` in this folder, which needs protoc (Debian:
// protobuf-compiler) and, on PATH, protoc-gen-go
// (google.golang.org/protobuf/cmd/protoc-gen-go at go.mod's version) and
// protoc-gen-go-grpc (google.golang.org/grpc/cmd/protoc-gen-go-grpc).
package testpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative echo.proto
