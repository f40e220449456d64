// Command twoguest-agent lets a test on one host run programs on another
// and power it off (package twoguest). `make faults` runs it in guest B of
// scripts/softroce pair:
//
//	twoguest-agent [-listen host:port]       serve (default: port 7390 on every address)
//	twoguest-agent -agent host:port run CMD [ARGS...]
//	                                         run CMD on the agent's host: its output, its exit status
//	twoguest-agent -agent host:port poweroff power that host off
//
// -agent defaults to $TWOGUEST_AGENT or $SOFTROCE_PEER_CTL_ADDR (port 7390),
// so in guest A of scripts/softroce pair `twoguest-agent run rdma link` runs
// on guest B. The agent runs whatever it is asked to, as its own user: listen
// only on a network the tests own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"

	"github.com/verbline/rdma/internal/rdmatest/twoguest"
)

func main() {
	listen := flag.String("listen", fmt.Sprintf(":%d", twoguest.DefaultPort), "serve on `host:port`: in scripts/softroce pair, every address: the control link for commands, the wire for twoguest.Env.WireUp")
	agent := flag.String("agent", twoguest.AgentAddr(), "the agent to send a command to, `host:port`")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: twoguest-agent [-listen host:port]\n"+
			"       twoguest-agent [-agent host:port] run CMD [ARGS...] | poweroff\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	log.SetFlags(log.Lmicroseconds)
	log.SetPrefix("twoguest-agent: ")
	if flag.NArg() == 0 {
		serve(*listen)
		return
	}
	if *agent == "" {
		log.Fatal("no agent to talk to: give -agent host:port (or set TWOGUEST_AGENT)")
	}
	c := &twoguest.Client{Addr: *agent}
	ctx := context.Background()
	switch flag.Arg(0) {
	case "run":
		if flag.NArg() < 2 {
			flag.Usage()
			os.Exit(2)
		}
		p, err := c.Start(ctx, twoguest.Cmd{Args: flag.Args()[1:]})
		if err != nil {
			log.Fatal(err)
		}
		st, err := p.Wait(ctx)
		if err != nil {
			log.Fatal(err)
		}
		os.Stdout.WriteString(st.Output)
		if st.Code != 0 || st.Signal != "" {
			log.Printf("%v: %v", p, st)
			os.Exit(max(st.Code, 1))
		}
	case "poweroff":
		if err := c.PowerOff(ctx); err != nil {
			log.Fatal(err)
		}
	default:
		flag.Usage()
		os.Exit(2)
	}
}

func serve(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", ln.Addr())
	a := &twoguest.Agent{Log: log.Default()}
	// Serve returns only when ln fails.
	if err := a.Serve(ln); !errors.Is(err, net.ErrClosed) {
		log.Fatal(err)
	}
}
