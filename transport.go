package rdma

import (
	"math/bits"
	"time"
)

// RC transport settings (Config.AckTimeout, RetryCount), in the units the
// QP attributes take.

// ackTimeoutExp is the exponent n of the QP's local ACK timeout
// (4.096 µs x 2^n) that covers d: the smallest n with 4.096 µs x 2^n >= d,
// within 1..31.
func ackTimeoutExp(d time.Duration) uint8 {
	units := (d + 4096*time.Nanosecond - 1) / (4096 * time.Nanosecond) // ceil(d / 4.096 µs)
	if units <= 2 {
		return 1
	}
	n := bits.Len64(uint64(units - 1)) // ceil(log2(units))
	return uint8(min(n, 31))
}

// ackTimeoutOf is the duration of exponent n.
func ackTimeoutOf(n uint8) time.Duration { return 4096 * time.Nanosecond << n }
