package lab

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// Ask sends one A query for name from inside namespace ns to the lab's VIP,
// on a socket of its own, and waits up to timeout for the answer.
func Ask(ns, name string, timeout time.Duration) error {
	return nsutil.Do(ns, func() error {
		c, err := net.Dial("udp", netip.AddrPortFrom(VIP, 53).String())
		if err != nil {
			return fmt.Errorf("asking %s in %s: %w", name, ns, err)
		}
		defer c.Close()
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		b, err := m.Pack()
		if err != nil {
			return err
		}
		if _, err := c.Write(b); err != nil {
			return fmt.Errorf("asking %s in %s: %w", name, ns, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(timeout))
		buf := make([]byte, 512)
		if _, err := c.Read(buf); err != nil {
			return fmt.Errorf("asking %s in %s: %w", name, ns, err)
		}
		return nil
	})
}
