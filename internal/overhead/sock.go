package overhead

import (
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// mmsg is a reusable batch of messages for sendmmsg/recvmmsg.
type mmsg struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	bufs  [][]byte
	names []unix.RawSockaddrInet4
}

func newMmsg(n, size int, names bool) *mmsg {
	m := &mmsg{hdrs: make([]unix.Mmsghdr, n), iovs: make([]unix.Iovec, n), bufs: make([][]byte, n)}
	if names {
		m.names = make([]unix.RawSockaddrInet4, n)
	}
	for i := range m.hdrs {
		m.bufs[i] = make([]byte, size)
		m.iovs[i].Base = &m.bufs[i][0]
		m.iovs[i].SetLen(size)
		m.hdrs[i].Hdr.Iov = &m.iovs[i]
		m.hdrs[i].Hdr.SetIovlen(1)
		if names {
			m.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&m.names[i]))
			m.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
		}
	}
	return m
}

// setLen sets the payload length of every message (before a send).
func (m *mmsg) setLen(n int) {
	for i := range m.iovs {
		m.iovs[i].SetLen(n)
	}
}

// prepRecv resets the lengths the kernel overwrote.
func (m *mmsg) prepRecv() {
	for i := range m.hdrs {
		m.iovs[i].SetLen(len(m.bufs[i]))
		if m.names != nil {
			m.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
		}
	}
}

func sendmmsg(fd int, h []unix.Mmsghdr) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&h[0])), uintptr(len(h)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func recvmmsg(fd int, h []unix.Mmsghdr) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&h[0])), uintptr(len(h)), unix.MSG_WAITFORONE, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// udpSocket makes an IPv4 UDP socket inside namespace ns (a socket keeps
// the namespace it was made in). bind and connect are optional. Blocking
// calls on it time out after 100 ms so loops can check their deadline.
func udpSocket(ns string, bind, connect netip.AddrPort) (int, error) {
	fd := -1
	err := nsutil.Do(ns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("creating UDP socket: %w", err)
		}
		tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
		// Large buffers so the sink, not its socket, is what counts.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4<<20)
		if bind.IsValid() {
			if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: bind.Addr().As4(), Port: int(bind.Port())}); err != nil {
				return fmt.Errorf("binding %s in %s: %w", bind, ns, err)
			}
		}
		if connect.IsValid() {
			if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: connect.Addr().As4(), Port: int(connect.Port())}); err != nil {
				return fmt.Errorf("connecting to %s in %s: %w", connect, ns, err)
			}
		}
		return nil
	})
	if err != nil && fd >= 0 {
		unix.Close(fd)
		fd = -1
	}
	return fd, err
}
