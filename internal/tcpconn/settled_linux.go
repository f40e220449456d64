package tcpconn

import (
	"net"

	"golang.org/x/sys/unix"
)

// The states of a Linux TCP socket (include/net/tcp_states.h) in which
// nothing sent awaits the peer's acknowledgement once the sending side is
// shut down: the FIN, the last byte sent, is acknowledged (FIN_WAIT2,
// TIME_WAIT; LAST_ACK's acknowledgement leads to CLOSE), or the connection
// was reset (CLOSE).
const (
	tcpStateFinWait2 = 5
	tcpStateTimeWait = 6
	tcpStateClose    = 7
)

// sendSettled reports whether the peer acknowledged everything nc sent,
// its FIN included, or the connection is gone. Called after nc's writing
// side is shut down. known is false if the socket's state could not be read.
func sendSettled(nc *net.TCPConn) (settled, known bool) {
	rc, err := nc.SyscallConn()
	if err != nil {
		return false, false
	}
	var info *unix.TCPInfo
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || gerr != nil {
		return false, false
	}
	switch info.State {
	case tcpStateFinWait2, tcpStateTimeWait, tcpStateClose:
		return true, true
	}
	return false, true
}
