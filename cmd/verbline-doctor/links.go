package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
)

// rdmaLinks is Env.Links on a machine: the netdev bound to each RDMA port,
// from iproute2's `rdma -j link show` (the kernel's RDMA netlink).
func rdmaLinks() (map[string]string, error) {
	out, err := exec.Command("rdma", "-j", "link", "show").Output()
	if err != nil {
		return nil, fmt.Errorf("rdma link show (iproute2): %w", err)
	}
	return parseLinks(out)
}

// parseLinks reads `rdma -j link show`'s JSON: one object per port, with
// the device's name (ifname), the port number and the bound netdev, if any.
func parseLinks(b []byte) (map[string]string, error) {
	var links []struct {
		Dev    string `json:"ifname"`
		Port   int    `json:"port"`
		Netdev string `json:"netdev"`
	}
	if err := json.Unmarshal(b, &links); err != nil {
		return nil, fmt.Errorf("rdma link show's JSON: %w", err)
	}
	m := make(map[string]string, len(links))
	for _, l := range links {
		if l.Netdev != "" {
			m[fmt.Sprintf("%s/%d", l.Dev, l.Port)] = l.Netdev
		}
	}
	return m, nil
}
