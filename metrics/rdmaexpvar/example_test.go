package rdmaexpvar_test

import (
	"encoding/json"
	"expvar"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/metrics/rdmaexpvar"
)

// Publish the library's metrics and read them back as a monitoring agent
// would, from /debug/vars. A program serves that with
// http.ListenAndServe("localhost:6060", nil); here a test server stands in.
// On a machine without RDMA, or with no connection open, ConnsOpen is 0.
func ExamplePublish() {
	if err := rdmaexpvar.Publish("rdma_metrics"); err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(expvar.Handler()) // what /debug/vars serves
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/debug/vars")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var vars struct {
		RDMA *rdma.Metrics `json:"rdma_metrics"` // the other variables (memstats, cmdline) are ignored
	}
	if err := json.NewDecoder(resp.Body).Decode(&vars); err != nil {
		log.Fatal(err)
	}
	fmt.Println("published:", vars.RDMA != nil)
	fmt.Println("connections open:", vars.RDMA.ConnsOpen)

	// A name is published once per process.
	fmt.Println(rdmaexpvar.Publish("rdma_metrics"))
	// Output:
	// published: true
	// connections open: 0
	// rdmaexpvar: an expvar variable named "rdma_metrics" is already published (names are process-wide: pick another)
}
