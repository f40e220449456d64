// Command verbline-doctor checks whether this machine can run verbline
// (github.com/verbline/rdma), and optionally the RDMA path to a peer.
//
//	verbline-doctor                          # check this machine
//	verbline-doctor -listen 192.168.1.10:7471   # on the peer: an echo listener
//	verbline-doctor -peer 192.168.1.10:7471     # check this machine, then time ping-pongs to the peer
//	verbline-doctor -json                    # machine-readable
//
// It checks the build (cgo), /dev/infiniband/rdma_cm and uverbs (rdma_ucm,
// ib_uverbs), the RDMA devices and what libibverbs sees of them, each port's
// state, link layer and active MTU, a RoCE v2 GID for each IP of the RDMA
// netdevs, RLIMIT_MEMLOCK against what the default Config registers, and
// huge pages. Each problem is printed with what to do about it.
//
// Exit status: 0 when RDMA can run (warnings allowed), 1 when something
// blocks it, 2 on a usage error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/verbline/rdma"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// machineEnv is the Env of this machine.
func machineEnv() Env {
	return Env{Root: "/", Cgo: cgoEnabled, Memlock: realMemlock, Addrs: ipAddrs, Verbs: verbsProbe, Links: rdmaLinks}
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verbline-doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	peer := fs.String("peer", "", "also dial the verbline echo listener at `host:port` and time ping-pongs")
	listen := fs.String("listen", "", "run an echo listener on `host:port` for another machine's -peer (port 0 picks one), until interrupted")
	count := fs.Int("count", 100, "ping-pongs to time with -peer")
	msgSize := fs.Int("size", 64, "bytes per ping with -peer")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on the dial and on the ping-pongs with -peer")
	jsonOut := fs.Bool("json", false, "print the results as JSON")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: verbline-doctor [-json] [-peer host:port [-count n] [-size bytes] [-timeout d]]\n"+
			"       verbline-doctor -listen host:port\n\n"+
			"Checks whether this machine can run verbline RDMA connections; exit status 0 when it can,\n"+
			"1 when something blocks it, 2 on a usage error.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(msg string) int {
		fmt.Fprintf(stderr, "verbline-doctor: %s\n", msg)
		fs.Usage()
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usage(fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	case *listen != "" && *peer != "":
		return usage("-listen and -peer go on different machines (or processes): give one")
	case *count < 1:
		return usage("-count must be at least 1")
	case *msgSize < 1:
		return usage("-size must be at least 1")
	case *timeout <= 0:
		return usage("-timeout must be positive")
	}
	if *listen != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return serveEcho(ctx, *listen, stdout)
	}

	results := Run(machineEnv())
	if *peer != "" {
		results = append(results, checkPeer(*peer, *count, *msgSize, *timeout))
	}
	code := ExitCode(results)
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		enc.Encode(struct {
			OK      bool     `json:"ok"`
			Exit    int      `json:"exit"`
			Results []Result `json:"results"`
		}{code == 0, code, results})
		return code
	}
	printText(stdout, results, code)
	return code
}

// printText prints one line per check, and under each problem the line that
// says what to do.
func printText(w io.Writer, results []Result, code int) {
	width := 0
	for _, r := range results {
		width = max(width, len(r.Name))
	}
	var fails, warns int
	for _, r := range results {
		fmt.Fprintf(w, "%-4s  %-*s  %s\n", strings.ToUpper(r.Status.String()), width, r.Name, r.Detail)
		if r.Note != "" {
			fmt.Fprintf(w, "      %-*s  note: %s\n", width, "", r.Note)
		}
		if r.Fix != "" {
			// A fix taken from the library's hint may span lines: indent them under the first.
			fix := strings.ReplaceAll(r.Fix, "\n", "\n"+strings.Repeat(" ", width+13))
			fmt.Fprintf(w, "      %-*s  fix: %s\n", width, "", fix)
		}
		switch r.Status {
		case Fail:
			fails++
		case Warn:
			warns++
		}
	}
	if code != 0 {
		fmt.Fprintf(w, "verbline cannot run: %d problem%s block%s RDMA", fails, plural(fails), map[bool]string{true: "s"}[fails == 1])
	} else {
		fmt.Fprintf(w, "verbline can run here")
	}
	if warns > 0 {
		fmt.Fprintf(w, " (%d warning%s)", warns, plural(warns))
	}
	fmt.Fprintln(w)
}

// serveEcho runs an echo listener on addr until ctx ends.
func serveEcho(ctx context.Context, addr string, stdout io.Writer) int {
	ln, err := rdma.Listen("rdma", addr)
	if err != nil {
		fix := strings.ReplaceAll(listenFix(err), "\n", "\n           ")
		fmt.Fprintf(stdout, "FAIL  listen %s: %v\n      fix: %s\n", addr, err, fix)
		return 1
	}
	fmt.Fprintf(stdout, "verbline-doctor: echo listener on %s (stop with Ctrl-C)\n", ln.Addr())
	s := newEchoServer(ln)
	<-ctx.Done()
	s.close()
	return 0
}

func listenFix(err error) string {
	switch {
	case errors.Is(err, rdma.ErrNotRDMAAddress):
		return libraryHint(err, "listen on an IP of an RDMA netdev (`rdma link show` lists the netdevs; `ip addr show <netdev>` their IPs)")
	case errors.Is(err, syscall.EADDRINUSE):
		return "the port is taken: pick another, or 0 for a free one"
	}
	return "run verbline-doctor without -listen to see what blocks RDMA here"
}
