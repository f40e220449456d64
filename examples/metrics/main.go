// Command metrics moves data over RDMA and serves the library's metrics
// over HTTP: expvar's /debug/vars (metrics/rdmaexpvar) and Prometheus'
// /metrics (metrics/rdmaprom).
//
//	metrics -addr 192.168.1.10 -http :9464 -keep   # traffic, then serve until interrupted
//	curl -s localhost:9464/metrics | grep verbline_rdma_
//	curl -s localhost:9464/debug/vars | jq .rdma
//
// With no flags it uses -addr $RDMA_TEST_ADDR (which scripts/softroce sets)
// and -http 127.0.0.1:0: it echoes data over one RDMA connection, fetches
// its own /debug/vars and /metrics over HTTP while the connection is open
// and again after it closed, prints what they say, and exits 0 if both
// counted what it moved.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"expvar"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/metrics/rdmaexpvar"
	"github.com/verbline/rdma/metrics/rdmaprom"
)

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR"), "IP of an RDMA netdev (rdma link show lists them)")
	httpAddr := flag.String("http", "127.0.0.1:0", "address to serve /metrics and /debug/vars on")
	rounds := flag.Int("rounds", 64, "echo round trips of -size bytes")
	size := flag.Int("size", 64<<10, "bytes per round trip")
	keep := flag.Bool("keep", false, "after the traffic, keep serving the metrics until interrupted")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("metrics example: ")
	if *addr == "" {
		log.Fatal("no address: give -addr with an IP of an RDMA netdev (rdma link show lists them), or set RDMA_TEST_ADDR (scripts/softroce run sets it)")
	}
	srv, err := serveMetrics(*httpAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	if err := run(os.Stdout, srv.url, *addr, *rounds, *size); err != nil {
		log.Fatal(err)
	}
	if *keep {
		fmt.Printf("serving %s/metrics and %s/debug/vars until interrupted\n", srv.url, srv.url)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt)
		<-sig
	}
}

// metricsServer serves /debug/vars and /metrics on its own mux.
type metricsServer struct {
	url string // http://host:port
	srv *http.Server
}

// Close stops serving and closes the server's connections.
func (s *metricsServer) Close() error { return s.srv.Close() }

// serveMetrics publishes the library's metrics as the expvar "rdma" and
// registers its Prometheus collector, and serves both over HTTP at addr.
func serveMetrics(addr string) (*metricsServer, error) {
	if err := rdmaexpvar.Publish("rdma"); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(rdmaprom.NewCollector())
	mux := http.NewServeMux()
	mux.Handle("/debug/vars", expvar.Handler())
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	return &metricsServer{url: "http://" + ln.Addr().String(), srv: srv}, nil
}

// run echoes rounds*size bytes over an RDMA connection to a server in this
// process, and checks what /debug/vars and /metrics at url report while
// the connection is open and after it closed.
func run(out io.Writer, url, addr string, rounds, size int) error {
	ln, err := rdma.Listen("rdma", net.JoinHostPort(addr, "0"))
	if err != nil {
		return err
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err == nil {
			_, err = io.Copy(s, s) // echo until the client closes
			s.Close()
		}
		served <- err
	}()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	if err != nil {
		return err
	}
	device, before, err := deviceOf(url, c)
	if err != nil {
		c.Close()
		return err
	}

	buf, back := make([]byte, size), make([]byte, size)
	for i := range rounds {
		for j := range buf {
			buf[j] = byte(i + j)
		}
		if _, err := c.Write(buf); err != nil {
			c.Close()
			return err
		}
		if _, err := io.ReadFull(c, back); err != nil {
			c.Close()
			return err
		}
		if !bytes.Equal(buf, back) {
			c.Close()
			return fmt.Errorf("round %d: the echo differs", i)
		}
	}
	moved := uint64(2 * rounds * size) // each end sent it once: client to server and back

	during, err := scrapeExpvar(url, device)
	if err != nil {
		c.Close()
		return err
	}
	prom, err := scrapePrometheus(url, device)
	if err != nil {
		c.Close()
		return err
	}
	fmt.Fprintf(out, "echoed %d x %d bytes over %s (%s)\n", rounds, size, device, c.RemoteAddr())
	fmt.Fprintf(out, "/debug/vars rdma: %d connections open, %d bytes sent, %d received, %d credit stalls, %d poller wake-ups, %d parks\n",
		during.ConnsOpen, during.BytesSent-before.BytesSent, during.BytesReceived-before.BytesReceived,
		during.CreditStalls-before.CreditStalls, during.PollerWakeups-before.PollerWakeups, during.Parks-before.Parks)
	fmt.Fprintf(out, "/metrics: verbline_rdma_connections_open %v, verbline_rdma_sent_bytes_total %v, verbline_rdma_received_bytes_total %v\n",
		prom["verbline_rdma_connections_open"], prom["verbline_rdma_sent_bytes_total"], prom["verbline_rdma_received_bytes_total"])
	for _, p := range during.Ports {
		fmt.Fprintf(out, "%s port %d hardware counters: %d\n", device, p.Port, len(p.HW)+len(p.Standard))
	}
	if len(during.Ports) == 0 {
		fmt.Fprintf(out, "%s: its driver exports no hardware counters\n", device) // Soft-iWARP
	}
	var errs []error
	if during.ConnsOpen != 2 {
		errs = append(errs, fmt.Errorf("/debug/vars: %d connections open, want 2 (both ends)", during.ConnsOpen))
	}
	if got := during.BytesSent - before.BytesSent; got != moved {
		errs = append(errs, fmt.Errorf("/debug/vars: %d bytes sent, want %d", got, moved))
	}
	if got := during.BytesReceived - before.BytesReceived; got != moved {
		errs = append(errs, fmt.Errorf("/debug/vars: %d bytes received, want %d", got, moved))
	}
	if got := prom["verbline_rdma_sent_bytes_total"]; got != float64(during.BytesSent) {
		errs = append(errs, fmt.Errorf("/metrics: verbline_rdma_sent_bytes_total %v, /debug/vars %d", got, during.BytesSent))
	}
	if prom["verbline_rdma_connections_open"] != 2 {
		errs = append(errs, fmt.Errorf("/metrics: verbline_rdma_connections_open %v, want 2", prom["verbline_rdma_connections_open"]))
	}

	if err := c.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := <-served; err != nil {
		errs = append(errs, err)
	}
	after, err := scrapeExpvar(url, device)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	prom, err = scrapePrometheus(url, device)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	fmt.Fprintf(out, "closed: /debug/vars %d connections open, %d established in all; /metrics verbline_rdma_connections_open %v\n",
		after.ConnsOpen, after.ConnsTotal, prom["verbline_rdma_connections_open"])
	if after.ConnsOpen != 0 || prom["verbline_rdma_connections_open"] != 0 {
		errs = append(errs, errors.New("connections still counted as open after Close"))
	}
	if after.BytesSent < during.BytesSent {
		errs = append(errs, errors.New("bytes sent went down after Close"))
	}
	return errors.Join(errs...)
}

// deviceOf returns the device c runs on (the one whose connection count
// is not 0: this example has only c open) and its counters before c moved
// anything.
func deviceOf(url string, c *rdma.Conn) (string, rdma.DeviceMetrics, error) {
	m, err := scrapeAll(url)
	if err != nil {
		return "", rdma.DeviceMetrics{}, err
	}
	for _, d := range m.Devices {
		if d.ConnsOpen > 0 {
			return d.Device, d, nil
		}
	}
	return "", rdma.DeviceMetrics{}, fmt.Errorf("/debug/vars shows no open connection, with %v to %v open", c.LocalAddr(), c.RemoteAddr())
}

func scrapeAll(url string) (rdma.Metrics, error) {
	var vars struct{ RDMA rdma.Metrics }
	resp, err := http.Get(url + "/debug/vars")
	if err != nil {
		return rdma.Metrics{}, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&vars); err != nil {
		return rdma.Metrics{}, fmt.Errorf("/debug/vars: %w", err)
	}
	return vars.RDMA, nil
}

// scrapeExpvar returns the device's entry of the expvar "rdma".
func scrapeExpvar(url, device string) (rdma.DeviceMetrics, error) {
	m, err := scrapeAll(url)
	if err != nil {
		return rdma.DeviceMetrics{}, err
	}
	for _, d := range m.Devices {
		if d.Device == device {
			return d, nil
		}
	}
	return rdma.DeviceMetrics{}, fmt.Errorf("/debug/vars: no device %s", device)
}

// scrapePrometheus returns the device's verbline_rdma_ samples of /metrics
// with only a device label, by name.
func scrapePrometheus(url, device string) (map[string]float64, error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	suffix := `{device="` + device + `"}`
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if name, found := strings.CutSuffix(name, suffix); ok && found && strings.HasPrefix(name, "verbline_rdma_") {
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return nil, fmt.Errorf("/metrics: %s: %w", sc.Text(), err)
			}
			out[name] = v
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("/metrics has no verbline_rdma_ sample for device %s", device)
	}
	return out, sc.Err()
}
