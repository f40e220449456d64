// Package ud is the UD datagram endpoint behind the public PacketConn: the
// queue pair, its rings, the SIDR address resolutions and the answers to
// other endpoints' (Endpoint, endpoint.go), and its parts that need no
// device: the destinations' cache (PeerCache) and the check of a received
// datagram's GRH and header (ParseDatagram), which with the endpoint's
// receive path are tested and fuzzed on the host.
//
// The package cannot import the root package, whose PacketConn embeds the
// endpoint. Options carries what the endpoint takes from the Config and
// the device acquisition with the Config's device settings; Endpoint is
// generic over the type it delivers datagrams as (the root's Datagram,
// whose underlying struct is Datagram's), so Messages() is the public
// channel type as it is, with no copy and no goroutine in between; Stats
// converts to the root's PacketStats. The errors it returns are
// internal/errs' values, which the root package exports.
package ud
