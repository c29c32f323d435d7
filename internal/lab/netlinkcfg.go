package lab

import "github.com/mdlayher/netlink"

func netlinkConfig(nsfd int) *netlink.Config { return &netlink.Config{NetNS: nsfd} }
