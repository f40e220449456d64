//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStatFileRereads: each read returns the file's current text in full,
// from one open file, past the initial buffer's size.
func TestStatFileRereads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	first := strings.Repeat("a", 10000)
	if err := os.WriteFile(path, []byte(first), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := openStat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.read(); err != nil || got != first {
		t.Fatalf("first read: %d bytes, %v; want %d bytes", len(got), err, len(first))
	}
	// Shorter text through the same open file: the read must not keep the
	// old text's tail.
	if err := os.WriteFile(path, []byte("42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := s.read(); err != nil || got != "42\n" {
		t.Fatalf("second read: %q, %v; want %q", got, err, "42\n")
	}
}

// TestStatFileProcfs: /proc/uptime read again through one open file moves
// on, as the sampler's /proc/stat readings must.
func TestStatFileProcfs(t *testing.T) {
	var sf statFiles
	a, err := sf.read("/proc/uptime")
	if err != nil {
		t.Fatal("reading /proc/uptime:", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		b, err := sf.read("/proc/uptime")
		if err != nil {
			t.Fatal(err)
		}
		if b != a {
			if len(sf.files) != 1 {
				t.Fatalf("%d files open for one path", len(sf.files))
			}
			return
		}
	}
	t.Fatalf("/proc/uptime read through one open file stayed %q for 2 s", a)
}
