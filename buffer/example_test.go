package buffer_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/verbline/rdma/buffer"
)

// A Pool without a Registrar hands out plain memory outside the Go heap
// (package rdma passes one that registers each arena with the device). A
// Buf is a value handle: its bytes are valid until its last Release, after
// which every copy of the handle is stale.
func ExamplePool() {
	pool, err := buffer.NewPool(nil, buffer.Options{}) // default size classes: 256 B to 4 MiB
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	b, err := pool.Get(1000) // from the 1 KiB class: the first Get maps an arena
	if err != nil {
		log.Fatal(err)
	}
	n := copy(b.Bytes(), "hello, buffer")
	b.SetLen(n)
	fmt.Printf("%q: Len %d, Cap %d\n", b.Bytes(), b.Len(), b.Cap())

	// Each reference needs its own Release; the last one gives the buffer
	// back to the pool.
	b.Retain()
	b.Release()
	fmt.Println("after one of two Releases, valid:", b.Valid())
	b.Release()
	fmt.Println("after the last, valid:", b.Valid(), "bytes:", b.Bytes())

	again, err := pool.Get(1000) // served from the free list: no new arena
	if err != nil {
		log.Fatal(err)
	}
	again.Release()

	_, err = pool.Get(pool.MaxSize() + 1)
	fmt.Println("larger than the largest class:", errors.Is(err, buffer.ErrTooLarge))

	st := pool.Stats()
	fmt.Printf("arenas %d, gets %d (hits %d, misses %d), in use %d B, high water %d B\n",
		st.Arenas, st.Gets, st.Hits, st.Misses, st.InUseBytes, st.HighWaterBytes)
	// Output:
	// "hello, buffer": Len 13, Cap 1024
	// after one of two Releases, valid: true
	// after the last, valid: false bytes: []
	// larger than the largest class: true
	// arenas 1, gets 3 (hits 1, misses 1), in use 0 B, high water 1024 B
}
