//go:build linux

package main

import (
	"io"
	"os"
	"sync"
)

// statFile is a kernel statistics file (procfs, sysfs) kept open and read
// again from offset 0 for each sample, which makes the kernel generate its
// text afresh. The sampler reads its files every sampleEvery on the very
// CPUs it measures: opening them (and globbing sysfs for the device
// counters) at each reading cost a quarter of the server's CPU in a
// CPU-bound case inside the TCG guest, counted as the server's own, and
// taken from it.
type statFile struct {
	mu  sync.Mutex
	f   *os.File
	buf []byte
}

func openStat(path string) (*statFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return &statFile{f: f, buf: make([]byte, 4096)}, nil
}

// read returns the file's whole current text.
func (s *statFile) read() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		n, err := s.f.ReadAt(s.buf, 0)
		if err != nil && err != io.EOF {
			return "", err
		}
		if n < len(s.buf) {
			return string(s.buf[:n]), nil
		}
		// Filled the buffer: the text may go on.
		s.buf = make([]byte, 2*len(s.buf))
	}
}

// statFiles opens each path once, on first use, and keeps them.
type statFiles struct {
	mu    sync.Mutex
	files map[string]*statFile
}

// read is path's current text, opening it at the first call.
func (sf *statFiles) read(path string) (string, error) {
	sf.mu.Lock()
	s, ok := sf.files[path]
	if !ok {
		var err error
		if s, err = openStat(path); err != nil {
			sf.mu.Unlock()
			return "", err
		}
		if sf.files == nil {
			sf.files = map[string]*statFile{}
		}
		sf.files[path] = s
	}
	sf.mu.Unlock()
	return s.read()
}

// kernelStats holds the statistics files the harness samples.
var kernelStats statFiles
