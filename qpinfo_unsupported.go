//go:build !linux || !cgo

package rdma

// QPInfo returns the error of every operation in this build (see Dial).
func (c *Conn) QPInfo() (QPInfo, error) {
	if c.tcp != nil {
		return QPInfo{}, c.tcp.notRDMA("qp info")
	}
	return QPInfo{}, opError("qp info")
}
