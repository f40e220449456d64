package rdma

import (
	"fmt"
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
