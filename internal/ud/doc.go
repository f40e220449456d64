// Package ud holds the parts of the UD datagram endpoint behind the public
// PacketConn that need no device: the destinations' cache (PeerCache) and
// the check of a received datagram's GRH and header (ParseDatagram), each
// with its tests and fuzz target, which so run anywhere. The endpoint
// itself (the queue pair, its rings, the SIDR resolutions) is in the root
// package (packetconn.go), beside the Config, device glue, QP creation and
// work-request ids it shares with the RC engine.
package ud
