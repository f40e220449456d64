//go:build linux

package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Off without RDMABENCH_SLOW_LOG (a nil log whose methods do nothing); on,
// only round trips at or above RDMABENCH_SLOW_RT are logged, each with the
// process's figures (a TCP connection has no connection counters).
func TestSlowLog(t *testing.T) {
	t.Setenv("RDMABENCH_SLOW_LOG", "")
	l, err := newSlowLog("conn-pingpong", 64, nil)
	if err != nil || l != nil {
		t.Fatalf("off: %v, %v", l, err)
	}
	l.begin()
	l.end(0, time.Second)
	l.close()

	path := filepath.Join(t.TempDir(), "slow.log")
	t.Setenv("RDMABENCH_SLOW_LOG", path)
	t.Setenv("RDMABENCH_SLOW_RT", "bogus")
	if _, err := newSlowLog("conn-pingpong", 64, nil); err == nil {
		t.Error("a bad RDMABENCH_SLOW_RT was accepted")
	}
	t.Setenv("RDMABENCH_SLOW_RT", "2ms")
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	l, err = newSlowLog("conn-pingpong", 64, a)
	if err != nil {
		t.Fatal(err)
	}
	l.begin()
	l.end(7, time.Millisecond)
	l.begin()
	l.end(8, 3*time.Millisecond)
	l.close()
	out, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "# conn-pingpong 64 B: round trips over 2ms") ||
		!strings.HasPrefix(lines[1], "conn-pingpong 64 B round trip 8: 3ms; process: ") || strings.Contains(lines[1], "connection:") {
		t.Errorf("log:\n%s", out)
	}
}
