package probe

import "github.com/dnsrace/dnsrace/internal/bpf"

// ForgetNetNS lets go of namespace ino once nothing but dnsrace held it:
// the netfilter program's links there are closed (each holds the
// namespace), and the kernel side forgets that it announced a DNS entry
// there, so a namespace born later with the same inode (nsfs hands a freed
// namespace's number to the next one) is announced again.
func (t *Tracer) ForgetNetNS(ino uint32) {
	t.UnwatchNetNS(ino)
	t.closeMu.RLock()
	defer t.closeMu.RUnlock()
	if m := t.maps[bpf.DnsraceMapCtNetns]; m != nil && !t.closed {
		_ = m.Delete(ino) // not there: never announced, or evicted
	}
}
