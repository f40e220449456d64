//go:build linux && cgo

package device

import (
	"testing"
	"time"

	"github.com/verbline/rdma/buffer"
)

// fakeReg registers nothing: arenas get made-up keys.
type fakeReg struct{ next uint32 }

type fakeRegistration uint32

func (r fakeRegistration) LKey() uint32 { return uint32(r) }
func (r fakeRegistration) RKey() uint32 { return uint32(r) }
func (r fakeRegistration) Addr() uint64 { return 0 }
func (r fakeRegistration) Close() error { return nil }

func (f *fakeReg) Register(mem []byte) (buffer.Registration, error) {
	f.next++
	return fakeRegistration(f.next), nil
}

// testDevice sets up a device with no verbs objects, registered under key
// with one reference, as Acquire leaves a new device.
func testDevice(t *testing.T, key uintptr, linger time.Duration) *Device {
	t.Helper()
	d := &Device{key: key, name: "fake0", refs: 1}
	d.LingerFor.Store(int64(linger))
	pool, err := buffer.NewPool(&fakeReg{}, buffer.Options{Classes: []int{4096}, MaxBytes: 16 << 20,
		OnIdle: func() { go d.BufReturned() }})
	if err != nil {
		t.Fatal(err)
	}
	d.Pool = pool
	registry.mu.Lock()
	if registry.m == nil {
		registry.m = make(map[uintptr]*Device)
	}
	if registry.m[key] != nil {
		registry.mu.Unlock()
		t.Fatalf("key %d already set up", key)
	}
	registry.m[key] = d
	registry.mu.Unlock()
	t.Cleanup(func() {
		registry.mu.Lock()
		d.refs = 0 // the test's connections are gone
		registry.mu.Unlock()
		TeardownUnused(true)
		waitFor(t, "teardowns", func() bool { return TearingDown() == 0 })
		ForgetFatal(key)
		if err := TakeTeardownErr(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	return d
}

func take(key uintptr) *Device {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return takeLocked(key)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestLingerThenTeardown(t *testing.T) {
	d := testDevice(t, 101, 50*time.Millisecond)
	start := time.Now()
	d.Release()
	if !d.Lingering() || !d.Registered() {
		t.Fatal("the device did not linger after its last connection")
	}
	waitFor(t, "the linger's end", func() bool { return !d.Registered() })
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Fatalf("torn down after %v, before its linger", el)
	}
	waitFor(t, "the teardown", func() bool { return TearingDown() == 0 })
	if take(101) != nil {
		t.Fatal("a torn-down device was handed out")
	}
}

func TestLingerEndsWithNewConnection(t *testing.T) {
	d := testDevice(t, 102, 100*time.Millisecond)
	d.Release()
	time.Sleep(60 * time.Millisecond)
	if got := take(102); got != d {
		t.Fatal("a lingering device was not handed to the next connection")
	}
	if d.Lingering() || d.Refs() != 1 {
		t.Fatalf("taken: lingering %v, refs %d", d.Lingering(), d.Refs())
	}
	// Past the first timer's end: the device is in use and stays.
	time.Sleep(80 * time.Millisecond)
	if !d.Registered() {
		t.Fatal("the first linger's timer tore down a device in use")
	}
	// Released again, it lingers a full linger anew (the clock read before
	// Release, which starts the linger's timer).
	released := time.Now()
	d.Release()
	waitFor(t, "the second linger's end", func() bool { return !d.Registered() })
	if el := time.Since(released); el < 100*time.Millisecond {
		t.Fatalf("torn down %v after its second release, before its linger", el)
	}
}

// A buffer out holds the device: no linger starts until it is back.
func TestBufferOutHoldsDevice(t *testing.T) {
	d := testDevice(t, 103, 30*time.Millisecond)
	b, err := d.Pool.Get(4096)
	if err != nil {
		t.Fatal(err)
	}
	d.Release()
	time.Sleep(60 * time.Millisecond)
	if !d.Registered() || d.Lingering() {
		t.Fatalf("with a buffer out: registered %v, lingering %v; want held, not lingering", d.Registered(), d.Lingering())
	}
	b.Release() // OnIdle: BufReturned starts the linger
	waitFor(t, "the teardown after the buffer came back", func() bool { return !d.Registered() })
}

func TestNoLingerTearsDownAtOnce(t *testing.T) {
	d := testDevice(t, 104, 0)
	d.Release()
	if d.Registered() {
		t.Fatal("a device without linger outlived its last connection")
	}
}

func TestFlushLingering(t *testing.T) {
	d := testDevice(t, 105, time.Hour)
	held := testDevice(t, 106, time.Hour)
	d.Release()
	FlushLingering()
	if d.Registered() {
		t.Fatal("FlushLingering left a lingering device")
	}
	if !held.Registered() {
		t.Fatal("FlushLingering tore down a device in use")
	}
	held.Release()
}

// A device that failed for good does not linger: it goes with its last
// connection.
func TestFatalDeviceDoesNotLinger(t *testing.T) {
	d := testDevice(t, 107, time.Hour)
	d.failAll(testFailure("fatal"))
	if Fatal(107) == nil {
		t.Fatal("no fatal record")
	}
	d.Release()
	if d.Registered() {
		t.Fatal("a failed device lingered")
	}
}

type testFailure string

func (e testFailure) Error() string { return string(e) }
