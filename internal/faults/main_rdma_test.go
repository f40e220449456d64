//go:build linux && cgo

package faults

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/verbline/rdma"
	"github.com/verbline/rdma/internal/rdmatest"
	"github.com/verbline/rdma/internal/rdmatest/twoguest"
	"github.com/verbline/rdma/internal/testhooks"
)

// The test binary is also the other end: on host B, StartSelf runs it with
// FAULTS_PEER set to a role (see peerRoles) and FAULTS_ADDR to the address
// of the listener on host A it dials.
func TestMain(m *testing.M) {
	flag.Parse()
	if !*rendezvous && *msgSizesFlag == "" {
		// Eager sizes only (up to the lossy Config's receive buffers):
		// -faults.rendezvous=false.
		msgSizes = slices.DeleteFunc(msgSizes, func(n int) bool { return n > *lossyBuffer })
	}
	if *msgSizesFlag != "" {
		msgSizes = nil
		for _, f := range strings.Split(*msgSizesFlag, ",") {
			var n int
			fmt.Sscan(f, &n)
			msgSizes = append(msgSizes, max(n, hdrLen))
		}
	}
	nWrites = min(*writesFlag, slots)
	if *wholeReads {
		testhooks.WholeReads.Store(true)
	}
	if *rxeBindAnytime {
		// Read by the library at each window bind (internal/device's quirks.go).
		testhooks.RXEBindAnytime.Store(true)
	}
	if *netemFlag != "" {
		// Commas separate too, so that the arguments pass through make
		// faults' FAULTS_ARGS, which splits at spaces.
		lossy = strings.FieldsFunc(*netemFlag, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
	}
	if role := os.Getenv("FAULTS_PEER"); role != "" {
		os.Exit(runPeer(role, os.Getenv("FAULTS_ADDR")))
	}
	os.Exit(m.Run())
}

var (
	streamMiB    = flag.Int("faults.stream-mib", 12, "MiB each way in TestLossyStream")
	cleanMiB     = flag.Int("faults.clean-mib", 24, "MiB each way in TestCleanStream")
	msgSizesFlag = flag.String("faults.msg-sizes", "", "message sizes of TestLossyMessages, comma-separated (default: msgSizes)")
	writesFlag   = flag.Int("faults.writes", slots, "one-sided writes each way in TestLossyMessages (at most 32)")
	// Rendezvous sizes over a lossy wire hang Soft-RoCE 6.1 when a window
	// is bound behind outstanding requests, which the library avoids there
	// (bindReadyLocked in post.go; docs/reliability.md): on by default, they check it.
	rendezvous     = flag.Bool("faults.rendezvous", true, "TestLossyMessages: also sizes above the receive buffers (rendezvous); false: eager sizes only")
	rxeBindAnytime = flag.Bool("faults.rxe-bind-anytime", false, "control runs: bind memory windows without waiting for an empty send queue (the library's Soft-RoCE workaround off: bindReadyLocked in post.go)")
	wholeReads     = flag.Bool("faults.whole-reads", false, "control runs: read each large message with one RDMA READ instead of in pieces (rendezvous.go, readChunk)")
	concurrent     = flag.Bool("faults.concurrent", false, "TestLossyMessages: both ways at once")
	netemFlag      = flag.String("faults.netem", "", "netem arguments of the lossy tests instead of lossy's, separated by commas or spaces (loss,2%,delay,1ms)")
	lossyRetries   = flag.Int("faults.lossy-retry-count", 0, "Config.RetryCount of both ends over the lossy wire (0: the library's default, 6)")
	timeoutFlag    = flag.Duration("faults.timeout", 0, "bound on each lossy transfer (0: from its size)")
	lossyBuffer    = flag.Int("faults.lossy-buffer", 4096, "Config.BufferSize of both ends over the lossy wire")
	ackTimeout     = flag.Duration("faults.ack-timeout", 134*time.Millisecond, "Config.AckTimeout of both ends")
	lossyAck       = flag.Duration("faults.lossy-ack-timeout", 268*time.Millisecond, "Config.AckTimeout of both ends over the lossy wire")
	msgCycles      = flag.Int("faults.msg-cycles", 3, "rounds of message sizes each way in TestLossyMessages")
)

// peerRoles are what host B's process can do: each dials host A's
// listener at addr and plays its part.
var peerRoles = map[string]func(ctx context.Context, addr string) (any, error){
	"stream": func(ctx context.Context, addr string) (any, error) {
		return withConn(ctx, addr, func(c *rdma.Conn) (any, error) {
			return exchangeStream(ctx, c, seedB, envInt64("FAULTS_BYTES"))
		})
	},
	"messages": func(ctx context.Context, addr string) (any, error) {
		return withConn(ctx, addr, func(c *rdma.Conn) (any, error) {
			return exchangeMessages(ctx, c, seedB, seedA, int(envInt64("FAULTS_SEND")), int(envInt64("FAULTS_RECV")))
		})
	},
	// flood writes until it dies and never reads: the peer that gets killed.
	"flood": func(ctx context.Context, addr string) (any, error) {
		return withConn(ctx, addr, func(c *rdma.Conn) (any, error) {
			buf := make([]byte, 256<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					return nil, err
				}
			}
		})
	},
	// echo sends one line and expects it back.
	"echo": func(ctx context.Context, addr string) (any, error) {
		return withConn(ctx, addr, func(c *rdma.Conn) (any, error) {
			msg := fmt.Sprintf("hello from pid %d\n", os.Getpid())
			if _, err := io.WriteString(c, msg); err != nil {
				return nil, err
			}
			got, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || got != msg {
				return nil, fmt.Errorf("echo: got %q, %w; want %q", got, err, msg)
			}
			return got, nil
		})
	},
	// reply waits for the listener's line and sends it back: the dialer
	// says nothing first.
	"reply": func(ctx context.Context, addr string) (any, error) {
		return withConn(ctx, addr, func(c *rdma.Conn) (any, error) {
			got, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return nil, fmt.Errorf("reply: %w", err)
			}
			if _, err := io.WriteString(c, got); err != nil {
				return nil, err
			}
			return got, nil
		})
	},
}

// withConn dials addr with the Config named by FAULTS_CONFIG, runs play
// and closes the connection (a Close that cannot deliver the end of the
// stream is an error).
func withConn(ctx context.Context, addr string, play func(*rdma.Conn) (any, error)) (any, error) {
	cfg := configs[os.Getenv("FAULTS_CONFIG")]
	if cfg == nil {
		return nil, fmt.Errorf("unknown FAULTS_CONFIG %q", os.Getenv("FAULTS_CONFIG"))
	}
	d := rdma.Dialer{Config: cfg()}
	nc, err := d.DialContext(ctx, "rdma", addr)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	c := nc.(*rdma.Conn)
	peerConn.Store(c)
	res, err := play(c)
	fmt.Printf("STATS before Close: %+v\n", c.Stats())
	start := time.Now()
	cerr := c.Close()
	fmt.Printf("CLOSED after %v: %v\n", time.Since(start).Round(time.Millisecond), cerr)
	if err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	return res, err
}

const seedA, seedB = 0xa, 0xb // the data each host sends is derived from its seed

// The Configs both ends use, by name (a peer process gets the name in
// FAULTS_CONFIG).
var configs = map[string]func() rdma.Config{"default": testConfig, "lossy": lossyConfig, "live": liveConfig}

// testConfig is the library's defaults but for two settings. The
// transport's ACK timeout is what a lost packet that no later packet
// reveals costs: rdma_cm's default on Soft-RoCE is 2.1 s; below the time
// the emulated guests take to send a window of packets, retransmissions
// start before the ACKs could arrive and spend the retry budget. Close
// waits for data still in flight: under loss that can take longer than
// its default 5 s.
func testConfig() rdma.Config {
	return rdma.Config{AckTimeout: *ackTimeout, CloseTimeout: rdmatest.Scale(10 * time.Second)}
}

// lossyConfig is testConfig with smaller receive buffers, for the lossy
// wire. rxe spends one retry per NAK and per timeout and restores the
// budget (RetryCount, at most 6) only on an ACK; at 3% loss and 1%
// reordering each way, a stream of 32 KiB messages (32 packets each) can
// exhaust it, and 4 KiB messages are acknowledged eight times as often.
// Its ACK timeout is longer than testConfig's: with the windows that grow
// with traffic, the emulated guests can be slow to answer on a loaded
// host, and seven tries without an ACK in between end the connection;
// 268 ms (4.096 us x 2^16) gives the retries 1.9 s. It is not longer
// because each tail loss costs the ACK timeout, which slows the stream
// (docs/performance.md, "A lossy wire", compares the settings).
func lossyConfig() rdma.Config {
	cfg := testConfig()
	cfg.BufferSize = *lossyBuffer
	cfg.AckTimeout = *lossyAck
	cfg.RetryCount = *lossyRetries
	return cfg
}

// runPeer is host B's process: dial addr, play role, print the result as
// a RESULT line (JSON) and exit 0, or print the error and exit 1.
func runPeer(role, addr string) int {
	play := peerRoles[role]
	if play == nil {
		fmt.Fprintf(os.Stderr, "unknown FAULTS_PEER role %q\n", role)
		return 2
	}
	ctx := context.Background()
	if s := os.Getenv("FAULTS_TIMEOUT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	res, err := play(ctx, addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "peer %s: %v\n", role, err)
		return 1
	}
	b, _ := json.Marshal(res)
	fmt.Printf("RESULT %s\n", b)
	return 0
}

func envInt64(k string) int64 {
	var n int64
	fmt.Sscan(os.Getenv(k), &n)
	return n
}

// startPeer starts this test binary on the peer as role, dialing ln with
// the Config named cfg, with env added (KEY=value) and this process's
// -faults flags.
func startPeer(t *testing.T, env *twoguest.Env, role, cfg string, ln *rdma.Listener, extra ...string) *twoguest.Proc {
	t.Helper()
	args := []string{"-test.run=^$"}
	flag.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "faults.") {
			args = append(args, "-"+f.Name+"="+f.Value.String())
		}
	})
	return env.StartSelf(t, append([]string{"GOTRACEBACK=all", "FAULTS_PEER=" + role, "FAULTS_CONFIG=" + cfg, "FAULTS_ADDR=" + ln.Addr().String()}, extra...), args...)
}

// peerResult waits for p to end and decodes its RESULT line into v.
func peerResult(t *testing.T, ctx context.Context, p *twoguest.Proc, v any) {
	t.Helper()
	st, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("%v: %v; output:\n%s", p, err, st.Output)
	}
	if st.Code != 0 {
		t.Fatalf("%v: %v; output:\n%s", p, st, st.Output)
	}
	for _, line := range strings.Split(st.Output, "\n") {
		if strings.HasPrefix(line, "CLOSED ") || strings.HasPrefix(line, "STATS ") {
			t.Logf("peer's Close: %s", line)
		}
		if s, ok := strings.CutPrefix(line, "RESULT "); ok {
			if err := json.Unmarshal([]byte(s), v); err != nil {
				t.Fatalf("%v: bad result %q: %v", p, s, err)
			}
			return
		}
	}
	t.Fatalf("%v printed no RESULT line; output:\n%s", p, st.Output)
}

// accept accepts one connection on ln, or fails t if p (the peer process
// that should dial) ends first or nothing arrives within d.
func accept(t *testing.T, ln *rdma.Listener, p *twoguest.Proc, d time.Duration) *rdma.Conn {
	t.Helper()
	type res struct {
		c   *rdma.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.AcceptRDMA()
		ch <- res{c, err}
	}()
	returned := false
	defer func() {
		if !returned {
			// t is failing: a connection accepted from now on would
			// outlive it, and its QP would count in the next test's leak
			// check (one failure would fail the tests after it).
			t.Cleanup(func() {
				ln.Close()
				if r := <-ch; r.c != nil {
					r.c.Close()
				}
			})
		}
	}()
	deadline := time.After(d)
	for {
		select {
		case r := <-ch:
			returned = true // the accept goroutine is done
			if r.err != nil {
				t.Fatal(r.err)
			}
			return r.c
		case <-deadline:
			t.Fatalf("no connection from %v within %v", p, d)
		case <-time.After(time.Second):
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			st, err := p.Status(ctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if st.Exited {
				t.Fatalf("%v ended (%v) before it connected; output:\n%s", p, st, st.Output)
			}
		}
	}
}

// fill fills b with the bytes of stream (seed, n).
func fill(b []byte, seed, n uint64) {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	binary.LittleEndian.PutUint64(key[8:], n)
	rand.NewChaCha8(key).Read(b)
}

var errExtra = errors.New("more data than expected")

// checkPeerResources waits (scaled, up to 10 s) until the peer's device
// counts equal base, and fails t if they do not.
func checkPeerResources(t *testing.T, env *twoguest.Env, base map[string]int) {
	t.Helper()
	deadline := time.Now().Add(rdmatest.Scale(10 * time.Second))
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		res, err := env.PeerResources(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if equalCounts(res, base) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer's device %s holds %v, %v before the test", env.PeerDevice, res, base)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// listenWith listens on this host's RDMA address with cfg.
func listenWith(t *testing.T, env *twoguest.Env, cfg rdma.Config) *rdma.Listener {
	t.Helper()
	lc := rdma.ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(env.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
