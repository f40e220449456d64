package rdma

import (
	"fmt"
	"math/bits"
	"time"
)

// ConfigError is a Config field outside its legal range. Dial, Listen and
// their Dialer and ListenConfig forms check the Config before any device
// work and return it (in a *net.OpError), so a bad setting never reaches
// the kernel as a bare EINVAL.
type ConfigError struct {
	Field  string // the Config field, e.g. "RetryCount"
	Value  any    // the value given
	Reason string // the legal range and what the value would have meant
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("invalid Config.%s %v: %s", e.Field, e.Value, e.Reason)
}

// check validates the transport settings of a Config as given by the user
// (zero values mean their documented defaults).
func (c *Config) check() error {
	if c == nil {
		return nil
	}
	bad := func(field string, v any, format string, args ...any) error {
		return &ConfigError{Field: field, Value: v, Reason: fmt.Sprintf(format, args...)}
	}
	if c.AckTimeout < 0 || c.AckTimeout > maxAckTimeout {
		return bad("AckTimeout", c.AckTimeout, "want 0 (rdma_cm's) or up to %v (4.096 µs x 2^31, the longest "+
			"the 5-bit exponent encodes; values are rounded up to 4.096 µs x 2^n)", maxAckTimeout)
	}
	retry := func(field string, v int, what string) error {
		switch {
		case v == 7:
			return bad(field, v, "want 1..%d (0 means %d): 7 means %s, so a stuck or vanished peer "+
				"would never be detected", maxRetry, defaultRetry, what)
		case v < 0 || v > maxRetry:
			return bad(field, v, "want 1..%d (0 means %d)", maxRetry, defaultRetry)
		}
		return nil
	}
	if err := retry("RetryCount", c.RetryCount, "retry forever on some devices (Soft-RoCE among them)"); err != nil {
		return err
	}
	if err := retry("RNRRetry", c.RNRRetry, "retry forever (IB specification)"); err != nil {
		return err
	}
	if c.MinRNRTimer < 0 || c.MinRNRTimer > maxMinRNRTimer {
		return bad("MinRNRTimer", c.MinRNRTimer, "want 0 (rdma_cm's: 655.36 ms) or 10 µs..%v "+
			"(rounded up to the RNR NAK timer table: 10 µs, 20 µs, 30 µs, ... 491.52 ms, 655.36 ms)", maxMinRNRTimer)
	}
	if c.MaxPathMTU != 0 && (c.MaxPathMTU < minPathMTU || c.MaxPathMTU > maxPathMTU) {
		return bad("MaxPathMTU", c.MaxPathMTU, "want 0 (the path's) or %d..%d bytes (rounded down to 256, 512, "+
			"1024, 2048 or 4096)", minPathMTU, maxPathMTU)
	}
	if c.ReadDepth < 0 || c.ReadDepth > maxReadDepth {
		return bad("ReadDepth", c.ReadDepth, "want 0 (%d) or 1..%d READs and atomics outstanding (rdma_cm carries "+
			"the depth in 8 bits)", defaultReadDepth, maxReadDepth)
	}
	if c.ServiceLevel < 0 || c.ServiceLevel > maxServiceLevel {
		return bad("ServiceLevel", c.ServiceLevel, "want 0..%d (the SL is 4 bits)", maxServiceLevel)
	}
	if c.TrafficClass < 0 || c.TrafficClass > maxTrafficClass {
		return bad("TrafficClass", c.TrafficClass, "want 0..%d (the GRH traffic class is 8 bits: DSCP << 2 | ECN)",
			maxTrafficClass)
	}
	if c.MaxUnreadBytes < 0 {
		return bad("MaxUnreadBytes", c.MaxUnreadBytes, "want 0 (%d MiB) or a positive number of bytes", defaultMaxUnread>>20)
	}
	if c.QPPool > maxQPPool {
		return bad("QPPool", c.QPPool, "want 0 (64), a negative value (no pool) or up to %d QPs per device", maxQPPool)
	}
	if c.DeviceLinger > maxDeviceLinger {
		return bad("DeviceLinger", c.DeviceLinger, "want 0 (2 s), a negative value (none) or up to %v", maxDeviceLinger)
	}
	return nil
}

// The QP pool's and the device linger's bounds (Config.QPPool,
// Config.DeviceLinger) and defaults.
// defaultMaxUnread is Config.MaxUnreadBytes's default.
const defaultMaxUnread = 16 << 20

const (
	maxQPPool           = 4096
	defaultQPPool       = 64
	maxDeviceLinger     = time.Hour
	defaultDeviceLinger = 2 * time.Second
)

// qpPoolSize is c's QPPool resolved: 0 for no pool.
func (c *Config) qpPoolSize() int {
	switch {
	case c.QPPool == 0:
		return defaultQPPool
	case c.QPPool < 0:
		return 0
	}
	return c.QPPool
}

// deviceLinger is c's DeviceLinger resolved: 0 for none.
func (c *Config) deviceLinger() time.Duration {
	switch {
	case c.DeviceLinger == 0:
		return defaultDeviceLinger
	case c.DeviceLinger < 0:
		return 0
	}
	return c.DeviceLinger
}

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
