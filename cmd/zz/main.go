package main

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

func main() {
	l, err := netlink.LinkByName("lo")
	fmt.Println("LinkByName", l != nil, err)
	ls, err := netlink.LinkList()
	fmt.Println("LinkList", len(ls), err)
	if len(ls) > 0 {
		fmt.Println(ls[0].Attrs().Name, ls[0].Attrs().Index)
	}
	l, err = netlink.LinkByIndex(1)
	fmt.Println("LinkByIndex", l != nil, err)
	a, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	fmt.Println("AddrList", len(a), err)
}
