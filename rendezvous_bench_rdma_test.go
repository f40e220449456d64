//go:build linux && cgo

package rdma

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkLargeMessageLend: what lending a large message (rendezvous)
// costs through a window bound per message, against a registration of
// exactly the message made and removed per message (the path of devices
// without windows; forceNoWindows here): Send, the peer's READ, Recv and
// Release, one message at a time, so each message's set-up and teardown
// is on the path. It reports MB/s and µs per message. Run inside the
// guest: `scripts/softroce run -- rdma.test -test.run '^$' -test.bench
// BenchmarkLargeMessageLend` (docs/performance.md).
func BenchmarkLargeMessageLend(b *testing.B) {
	for _, mode := range []string{"windows", "registrations"} {
		for _, n := range []int{64 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%s/%dKiB", mode, n>>10), func(b *testing.B) {
				defer forceNoWindows.Store(forceNoWindows.Swap(mode == "registrations"))
				c, s, ln := connPair(b, &Config{BufferSize: 4096})
				defer ln.Close()
				defer s.Close()
				defer c.Close()
				if mode == "windows" && !c.windows {
					b.Skip("the device has no memory windows")
				}
				ctx := context.Background()
				b.SetBytes(int64(n))
				b.ResetTimer()
				for range b.N {
					m, err := c.Alloc(n)
					if err != nil {
						b.Fatal(err)
					}
					if err := c.Send(ctx, m); err != nil {
						b.Fatal(err)
					}
					r, err := s.Recv(ctx)
					if err != nil {
						b.Fatal(err)
					}
					r.Release()
				}
				b.StopTimer() // the closes (about a second) are not the messages'
			})
		}
	}
}
