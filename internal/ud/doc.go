// Package ud holds the parts of the UD datagram endpoint behind the public
// PacketConn that need no device: the destinations' cache (PeerCache) and
// the check of a received datagram's GRH and header (ParseDatagram), each
// with its tests and fuzz target, which so run anywhere. The endpoint
// itself (the queue pair, its rings, the SIDR resolutions) uses the root
// package's Config, device glue and work-request ids, and stays there
// until those have a home it can share.
package ud
