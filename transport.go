package rdma

import (
	"math/bits"
	"time"
)

// RC transport settings (Config.AckTimeout, RetryCount, RNRRetry, ReadDepth,
// MinRNRTimer, MaxPathMTU, ServiceLevel, TrafficClass), in the units the QP
// attributes take, and their legal ranges (checked by Config.check before
// any device work).

const (
	// maxAckTimeout is the longest local ACK timeout the 5-bit exponent
	// encodes: 4.096 µs x 2^31, about 2 h 27 min.
	maxAckTimeout = 4096 * time.Nanosecond << 31
	// maxRetry is the largest RetryCount and RNRRetry offered: the 3-bit
	// fields' 7 means "retry forever" (for rnr_retry in the IB
	// specification, for retry_cnt too on some devices, Soft-RoCE among
	// them), so a vanished or stuck peer would never be detected.
	maxRetry = 6
	// defaultRetry is RetryCount's and RNRRetry's zero-value meaning.
	defaultRetry = 6
	// minPathMTU and maxPathMTU bound Config.MaxPathMTU (the IB MTUs).
	minPathMTU, maxPathMTU = 256, 4096
	// maxServiceLevel: the SL is 4 bits.
	maxServiceLevel = 15
	// maxTrafficClass: the GRH traffic class is 8 bits (DSCP and ECN on RoCE v2).
	maxTrafficClass = 255
	// defaultReadDepth is ReadDepth's zero-value meaning: the READs and
	// atomics each side keeps outstanding (QP tuning guides give 8-32;
	// rendezvous READs of large messages rarely need more than a few, the
	// atomics' rate grows with it).
	defaultReadDepth = 16
	// maxReadDepth: rdma_cm carries the depths in 8 bits.
	maxReadDepth = 255
)

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

// rnrTimerTable is the IB specification's encoding of the RNR NAK timer
// (min_rnr_timer; table 45 "Encoding for RNR NAK Timer Field"): code i
// means rnrTimerTable[i]. Code 0 is the longest, 655.36 ms, and is what
// rdma_cm gives a QP.
var rnrTimerTable = [32]time.Duration{
	655360 * time.Microsecond, 10 * time.Microsecond, 20 * time.Microsecond, 30 * time.Microsecond,
	40 * time.Microsecond, 60 * time.Microsecond, 80 * time.Microsecond, 120 * time.Microsecond,
	160 * time.Microsecond, 240 * time.Microsecond, 320 * time.Microsecond, 480 * time.Microsecond,
	640 * time.Microsecond, 960 * time.Microsecond, 1280 * time.Microsecond, 1920 * time.Microsecond,
	2560 * time.Microsecond, 3840 * time.Microsecond, 5120 * time.Microsecond, 7680 * time.Microsecond,
	10240 * time.Microsecond, 15360 * time.Microsecond, 20480 * time.Microsecond, 30720 * time.Microsecond,
	40960 * time.Microsecond, 61440 * time.Microsecond, 81920 * time.Microsecond, 122880 * time.Microsecond,
	163840 * time.Microsecond, 245760 * time.Microsecond, 327680 * time.Microsecond, 491520 * time.Microsecond,
}

// maxMinRNRTimer is the longest RNR NAK timer encoded (code 0).
const maxMinRNRTimer = 655360 * time.Microsecond

// rnrTimerCode is the code of the shortest table value >= d (0 < d <=
// maxMinRNRTimer): codes 1..31 grow with the duration, code 0 is the
// longest.
func rnrTimerCode(d time.Duration) uint8 {
	for code := 1; code < len(rnrTimerTable); code++ {
		if rnrTimerTable[code] >= d {
			return uint8(code)
		}
	}
	return 0
}

// rnrTimerOf is the duration code n encodes (n < 32).
func rnrTimerOf(n uint8) time.Duration { return rnrTimerTable[n&31] }

// mtuCode is the enum ibv_mtu value of the largest IB MTU <= bytes
// (256..4096): 1 (256) .. 5 (4096).
func mtuCode(bytes int) uint8 {
	code := uint8(1)
	for m := minPathMTU * 2; m <= bytes && m <= maxPathMTU; m *= 2 {
		code++
	}
	return code
}
