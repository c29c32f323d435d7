package lab

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/nsutil"
)

// Resolvers the lab can drive.
const (
	// ResolverGlibc runs the system's real glibc resolver: `getent ahosts`
	// inside the pod namespace with the pod's resolv.conf. It sends A and
	// AAAA together with sendmmsg on one connected socket.
	ResolverGlibc = "glibc"
	// ResolverPair is the deterministic same-tuple racer: two threads
	// pinned to different CPUs write A and AAAA at the same instant on one
	// connected socket, a new socket (so a new conntrack flow) per pair.
	ResolverPair = "pair"
	// ResolverMusl emulates musl's res_msend: one unconnected socket, A
	// and AAAA sent back to back with sendto, unanswered ones resent every
	// timeout/attempts (2.5 s by default). Like musl it ignores sendto's
	// errors, so a query dropped in the sender's own namespace (EPERM)
	// still waits for the next resend.
	ResolverMusl = "musl"
	// ResolverGo emulates Go's pure resolver: a new socket per query and
	// per attempt, so A and AAAA never share a 5-tuple; a failed send ends
	// the attempt at once.
	ResolverGo = "go"
)

// Resolvers lists the valid --resolver values.
var Resolvers = []string{ResolverGlibc, ResolverPair, ResolverMusl, ResolverGo}

// stallUnit is how long a resolver waits before it retries: a lookup that
// took about that long (or a multiple) stalled.
func stallUnit(resolver string, timeout time.Duration) time.Duration {
	if resolver == ResolverMusl {
		return timeout / 2 // timeout/attempts with attempts=2
	}
	return timeout
}

// ClientReport is what one pod's resolver measured.
type ClientReport struct {
	Pod      int    `json:"pod"`
	NetNS    string `json:"netns"`
	Resolver string `json:"resolver"`
	QName    string `json:"qname"`
	Lookups  int    `json:"lookups"`
	OK       int    `json:"ok"`
	Failed   int    `json:"failed"`
	// Stalls counts lookups that waited out at least one resolver
	// timeout; StallTimeouts counts the timeouts themselves (a lookup
	// that waited twice counts 2).
	Stalls        int       `json:"stalls"`
	StallTimeouts int       `json:"stall_timeouts"`
	StallsMs      []float64 `json:"stalls_ms"`
	// Crashed counts client processes that died by a signal.
	Crashed int `json:"crashed"`
	// Pairs and PairsLost: the pair resolver's A/AAAA pairs and how many
	// lost at least one answer.
	Pairs       int `json:"pairs,omitempty"`
	PairsLost   int `json:"pairs_lost,omitempty"`
	AnswersLost int `json:"answers_lost,omitempty"`

	durations []time.Duration
	unit      time.Duration
	stalled   *atomic.Bool // set at a stall, shared by a drive's clients; may be nil
}

func (c *ClientReport) record(d time.Duration, ok bool) {
	c.Lookups++
	if ok {
		c.OK++
	} else {
		c.Failed++
	}
	c.durations = append(c.durations, d)
	if n := int(math.Floor(float64(d) / float64(c.unit) * 1.02)); n >= 1 {
		c.Stalls++
		c.StallTimeouts += n
		c.StallsMs = append(c.StallsMs, float64(d.Microseconds())/1000)
		if c.stalled != nil {
			c.stalled.Store(true)
		}
	}
}

// clientParams are what every client loop needs.
type clientParams struct {
	topo     Topology
	pod      int
	resolver string
	timeout  time.Duration
	pairWait time.Duration
	// crashAfter, when set, kills the first in-flight glibc client
	// process after that long (a test hook for "a client crashed").
	crashAfter time.Duration
	stalled    *atomic.Bool // see ClientReport.stalled
}

// name is what the pod's k-th lookup asks: its own name, or with shared
// names the k-th of them (every pod asks the same ones in turn).
func (p clientParams) name(k int) string {
	if n := p.topo.SharedNames; n > 0 {
		return QName(k % n)
	}
	return QName(p.pod)
}

// runClient drives one pod's resolver: it starts lookups until stop ends and
// lets the one in flight finish unless ctx ends first. Stalled lookups take
// several timeouts; cutting them at the end of the window would hide
// exactly the stalls the lab is there to show.
func runClient(ctx, stop context.Context, p clientParams) *ClientReport {
	rep := &ClientReport{
		Pod: p.pod, NetNS: p.topo.PodNS(p.pod), Resolver: p.resolver, QName: p.name(0),
		unit: stallUnit(p.resolver, p.timeout), stalled: p.stalled,
	}
	var err error
	switch p.resolver {
	case ResolverGlibc:
		runGlibc(ctx, stop, p, rep)
	case ResolverPair:
		err = nsutil.Do(rep.NetNS, func() error { return runPair(ctx, stop, p, rep) })
	case ResolverMusl:
		err = nsutil.Do(rep.NetNS, func() error { return runMusl(ctx, stop, p, rep) })
	case ResolverGo:
		err = nsutil.Do(rep.NetNS, func() error { return runGo(ctx, stop, p, rep) })
	}
	if err != nil && ctx.Err() == nil {
		rep.Failed++
	}
	return rep
}

func runGlibc(ctx, stop context.Context, p clientParams, rep *ClientReport) {
	var mu sync.Mutex
	var inflight *exec.Cmd
	if p.crashAfter > 0 {
		t := time.AfterFunc(p.crashAfter, func() {
			mu.Lock()
			defer mu.Unlock()
			if inflight != nil {
				_ = inflight.Process.Signal(syscall.SIGKILL)
			}
		})
		defer t.Stop()
	}
	for stop.Err() == nil {
		cmd := nsutil.Command(ctx, rep.NetNS, "getent", "ahosts", p.name(rep.Lookups+rep.Crashed))
		t0 := time.Now()
		mu.Lock()
		exited, err := nsutil.Start(cmd)
		inflight = cmd
		mu.Unlock()
		if err != nil {
			rep.Failed++
			return
		}
		err = <-exited
		mu.Lock()
		inflight = nil
		mu.Unlock()
		d := time.Since(t0)
		if ctx.Err() != nil {
			return // cut short (interrupted, or past the drain bound): not a lookup
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ProcessState.Sys().(syscall.WaitStatus).Signaled() {
			rep.Crashed++
			continue
		}
		rep.record(d, err == nil)
	}
}

func newQuery(name string, qtype uint16) []byte {
	m := new(dns.Msg).SetQuestion(name, qtype)
	b, _ := m.Pack()
	return b
}

// udpSocket makes a UDP socket in the calling thread's namespace, bound to
// an ephemeral port and, when connect is set, connected to port 53 of to.
func udpSocket(connect bool, to netip.Addr) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if connect {
		if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: to.As4(), Port: 53}); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

// awaitAnswers reads DNS answers on fd until every id in want is answered
// or wait runs out; it returns how many stayed unanswered.
func awaitAnswers(fd int, want map[uint16]bool, wait time.Duration) int {
	deadline := time.Now().Add(wait)
	buf := make([]byte, 1500)
	for len(want) > 0 {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			break
		}
		m, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		if err != nil || m < 2 {
			continue
		}
		delete(want, uint16(buf[0])<<8|uint16(buf[1]))
	}
	return len(want)
}

// runPair is the deterministic same-tuple racer. Two sender threads are
// pinned to CPU 0 and CPU 1; each waits on a shared flag and writes its
// query the moment the flag flips, so both packets are in the node's
// conntrack at once, on two CPUs.
func runPair(ctx, stop context.Context, p clientParams, rep *ClientReport) error {
	ncpu := runtime.NumCPU()
	var gen atomic.Int64
	var ready sync.WaitGroup
	type job struct {
		fd  int
		msg []byte
	}
	jobs := [2]chan job{make(chan job), make(chan job)}
	done := make(chan struct{})
	defer close(done)
	for i := range 2 {
		go func(cpu int, in chan job) {
			runtime.LockOSThread()
			var set unix.CPUSet
			set.Set(cpu % ncpu)
			_ = unix.SchedSetaffinity(0, &set)
			for {
				select {
				case <-done:
					return
				case j := <-in:
					want := gen.Load() + 1
					ready.Done()
					for gen.Load() < want {
					}
					_, _ = unix.Write(j.fd, j.msg)
					ready.Done()
				}
			}
		}(i, jobs[i])
	}
	for stop.Err() == nil && ctx.Err() == nil {
		fd, err := udpSocket(true, p.topo.Nameserver())
		if err != nil {
			return err
		}
		a, aaaa := newQuery(p.name(rep.Pairs), dns.TypeA), newQuery(p.name(rep.Pairs), dns.TypeAAAA)
		idA, idAAAA := uint16(rep.Pairs*2), uint16(rep.Pairs*2+1)
		a[0], a[1] = byte(idA>>8), byte(idA)
		aaaa[0], aaaa[1] = byte(idAAAA>>8), byte(idAAAA)
		t0 := time.Now()
		ready.Add(2)
		jobs[0] <- job{fd, a}
		jobs[1] <- job{fd, aaaa}
		ready.Wait()
		ready.Add(2)
		gen.Add(1)
		ready.Wait()
		lost := awaitAnswers(fd, map[uint16]bool{idA: true, idAAAA: true}, p.pairWait)
		unix.Close(fd)
		rep.Pairs++
		rep.Lookups++
		rep.durations = append(rep.durations, time.Since(t0))
		if lost > 0 {
			rep.PairsLost++
			rep.AnswersLost += lost
			rep.Failed++
		} else {
			rep.OK++
		}
	}
	return nil
}

// runMusl emulates musl's resolver: one unconnected socket, both queries
// sent with sendto back to back, unanswered ones resent every retry
// interval until the timeout.
func runMusl(ctx, stop context.Context, p clientParams, rep *ClientReport) error {
	dst := &unix.SockaddrInet4{Addr: p.topo.Nameserver().As4(), Port: 53}
	retry := p.timeout / 2
	for stop.Err() == nil && ctx.Err() == nil {
		fd, err := udpSocket(false, netip.Addr{})
		if err != nil {
			return err
		}
		// A fresh random id, as musl's (from the clock) and glibc's are.
		// Ids counted from 0 had every pod ask the same id at the same
		// lookup, and the fentry and kprobe tiers key an unconnected
		// socket's query without its source address: two pods that drew
		// the same ephemeral port shared one flow there, which random ids
		// make 65,536 times rarer.
		id := uint16(rand.Uint32())
		name := p.name(rep.Lookups)
		qs := map[uint16][]byte{id: newQuery(name, dns.TypeA), id + 1: newQuery(name, dns.TypeAAAA)}
		want := map[uint16]bool{id: true, id + 1: true}
		t0 := time.Now()
		for time.Since(t0) < p.timeout && len(want) > 0 && ctx.Err() == nil {
			for qid := range want {
				q := qs[qid]
				q[0], q[1] = byte(qid>>8), byte(qid)
				_ = unix.Sendto(fd, q, 0, dst)
			}
			awaitAnswers(fd, want, min(retry, p.timeout-time.Since(t0)))
		}
		unix.Close(fd)
		if ctx.Err() != nil {
			return nil
		}
		rep.record(time.Since(t0), len(want) == 0)
	}
	return nil
}

// runGo emulates Go's pure resolver: A and AAAA in parallel, each on its own
// connected socket and with its own attempts, a new socket per attempt. A
// failed write (EPERM from a NAT drop in this namespace) ends the attempt
// at once, as Go's dnsPacketRoundTrip returns the write error. Sockets are
// made on this (namespaced) thread; the waits run in goroutines.
func runGo(ctx, stop context.Context, p clientParams, rep *ClientReport) error {
	const attempts = 2
	for stop.Err() == nil && ctx.Err() == nil {
		t0 := time.Now()
		qtypes := []uint16{dns.TypeA, dns.TypeAAAA}
		var fds [][attempts]int
		for range qtypes {
			var f [attempts]int
			for a := range f {
				fd, err := udpSocket(true, p.topo.Nameserver())
				if err != nil {
					for _, g := range fds {
						closeAll(g[:])
					}
					closeAll(f[:a])
					return err
				}
				f[a] = fd
			}
			fds = append(fds, f)
		}
		var wg sync.WaitGroup
		name := p.name(rep.Lookups)
		results := make([]bool, len(qtypes))
		for i, qt := range qtypes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer closeAll(fds[i][:])
				for a := 0; a < attempts && ctx.Err() == nil; a++ {
					q := newQuery(name, qt)
					id := uint16(rep.Lookups*4 + a*2 + i)
					q[0], q[1] = byte(id>>8), byte(id)
					if _, err := unix.Write(fds[i][a], q); err != nil {
						continue
					}
					if awaitAnswers(fds[i][a], map[uint16]bool{id: true}, p.timeout) == 0 {
						results[i] = true
						return
					}
				}
			}()
		}
		wg.Wait()
		if ctx.Err() != nil {
			return nil
		}
		rep.record(time.Since(t0), results[0] && results[1])
	}
	return nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
