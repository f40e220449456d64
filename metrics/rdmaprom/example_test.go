package rdmaprom_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/verbline/rdma/metrics/rdmaprom"
)

// Register the collector and scrape it, as Prometheus would, over HTTP; a
// program serves the handler on its own /metrics. Every series has a device
// label: a process that has not connected over RDMA yet (or a machine
// without RDMA) exports none, and the sum of connections_open over the
// devices is 0 while no connection is open.
func ExampleNewCollector() {
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	reg.MustRegister(rdmaprom.NewCollector())
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	_, err = io.Copy(io.Discard, resp.Body) // the text exposition format
	resp.Body.Close()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("scrape:", resp.Status)

	// In process, Gather returns the same metric families.
	mfs, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	open := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "verbline_rdma_connections_open" {
			for _, m := range mf.GetMetric() { // one per device
				open += m.GetGauge().GetValue()
			}
		}
	}
	fmt.Println("connections open:", open)
	// Output:
	// scrape: 200 OK
	// connections open: 0
}
