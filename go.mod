module github.com/verbline/rdma

go 1.26.0

require golang.org/x/sys v0.50.0

require golang.org/x/net v0.62.0

require github.com/klauspost/cpuid/v2 v2.4.2 // indirect
