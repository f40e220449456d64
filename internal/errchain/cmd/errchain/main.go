// Command errchain runs the errchain check (package
// github.com/verbline/rdma/internal/errchain) over packages:
//
//	go run ./internal/errchain/cmd/errchain ./...
package main

import (
	"golang.org/x/tools/go/analysis/singlechecker"

	"github.com/verbline/rdma/internal/errchain"
)

func main() { singlechecker.Main(errchain.Analyzer) }
