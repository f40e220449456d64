// Package ud holds the parts of the UD datagram endpoint behind the public
// PacketConn that need no device: the destinations' cache (PeerCache) and
// the check of a received datagram's GRH and header (ParseDatagram), each
// with its tests and fuzz target, which so run anywhere. The endpoint
// itself (the queue pair, its rings, the SIDR resolutions) still lives in
// the root package: it takes the root's Config, device glue, QP creation
// and work-request ids, and produces the public Datagram and PacketStats;
// it moves here once those reach it as a small options struct and type
// parameters.
package ud
