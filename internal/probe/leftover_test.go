package probe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/google/nftables"
	"github.com/miekg/dns"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/testutil"
)

// TestAnsweredLeavesNoEntries: once its answer is in, a query leaves
// nothing in the kernel's maps: no flow and no entry expecting its answer
// by the reply tuple (only its namespace's askers slot stays marked), both
// where the asking namespace's own conntrack tracks the query without NAT
// (its answer comes back by the flow's key reversed; entries made for it
// would never be deleted) and where it DNATs the query (the answer comes
// back by the entry's reply tuple). One tracer reads both cases, each in
// namespaces of its own.
func TestAnsweredLeavesNoEntries(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	tr := openTier(t, Options{Attach: testTier(t)})
	c := collect(t, tr)
	for _, tc := range []struct {
		name  string
		dnat  bool
		ctype nftables.ChainType
		prio  *nftables.ChainPriority
	}{
		{"conntrack", false, nftables.ChainTypeFilter, nftables.ChainPriorityFilter},
		{"dnat", true, nftables.ChainTypeNAT, nftables.ChainPriorityNATDest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTwoNS(t)
			to := serverAddr
			rule := ctStateNew() // makes the client's own conntrack track the query
			if tc.dnat {
				to, rule = vipAddr, join(ipDaddr(vipAddr), udpDport(53), dnatTo(serverAddr))
			}
			nftRules(t, n.client, nftables.TableFamilyIPv4, tc.ctype, nftables.ChainHookOutput, tc.prio, rule...)
			n.serveDNS(t, serverAddr, dns.RcodeSuccess, 1)
			conn := n.dial(t, "udp4", to, 53) // one entry, five queries
			for i := range 5 {
				qname := uniqueName(t)
				if err := exchange(conn, nil, dnsQuery(t, qname, dns.TypeA)); err != nil {
					t.Fatalf("query %d: no answer: %v", i, err)
				}
				q := c.query(t, qname)
				if _, ok := c.wait(5*time.Second, func(e *event.Event) bool { return e.Kind == event.KindAnswer && e.QID == q.QID }); !ok {
					c.dump(t)
					t.Fatalf("query %d: no ANSWER record", i)
				}
			}
			forEachEntry(t, tr, "flows", func(k, v []byte) {
				if flowNetNS(v) == n.clientIno {
					t.Errorf("a flow of the client namespace is left: key %x value %x", k, v)
				}
			})
			forEachEntry(t, tr, "answers", func(k, v []byte) {
				if binary.NativeEndian.Uint32(k) == n.clientIno {
					t.Errorf("an answers entry of the client namespace is left: key %x", k)
				}
			})
			var mark uint32
			if err := mapOf(t, tr, "askers").Lookup(n.clientIno&(askerSlots-1), &mark); err != nil {
				t.Fatal(err)
			}
			if mark != 1 {
				t.Errorf("askers slot of the client namespace is %d, want 1: it asked", mark)
			}
		})
	}
}

// askerSlots is ASKER_SLOTS in bpf/lib/maps.h.
const askerSlots = 4096

// mapOf returns the tracer's map called name (one map, shared by all its programs).
func mapOf(t *testing.T, tr *Tracer, name string) *ebpf.Map {
	t.Helper()
	m := tr.maps[name]
	if m == nil {
		t.Fatalf("the tracer has no map %q", name)
	}
	return m
}

// flowNetNS is the asking namespace of a flows map value.
func flowNetNS(v []byte) uint32 {
	return binary.NativeEndian.Uint32(v[unsafe.Offsetof(bpf.DnsraceFlow{}.Netns):])
}

// forEachEntry calls fn for every entry of map name. The programs and the
// sweeper delete entries meanwhile, and an iteration that loses its place
// too often is aborted: it is taken again, and fn sees one whole pass.
func forEachEntry(t *testing.T, tr *Tracer, name string, fn func(k, v []byte)) {
	t.Helper()
	type entry struct{ k, v []byte }
	var err error
	for range 10 {
		var all []entry
		var k, v []byte
		it := mapOf(t, tr, name).Iterate()
		for it.Next(&k, &v) {
			all = append(all, entry{bytes.Clone(k), bytes.Clone(v)})
		}
		if err = it.Err(); errors.Is(err, ebpf.ErrIterationAborted) {
			continue
		}
		if err != nil {
			break
		}
		for _, e := range all {
			fn(e.k, e.v)
		}
		return
	}
	t.Fatalf("iterating %s: %v", name, err)
}

// TestDroppedAtServerEndsFlow: a query its server's full socket drops
// (SOCKET_RCVBUFF, 5.17 on) can have no answer, so its flow ends with the
// drop record: a flooded server's drops do not fill the flow map. The
// queries the socket did take keep theirs.
func TestDroppedAtServerEndsFlow(t *testing.T) {
	testutil.RequireRoot(t)
	requireBTF(t)
	rcvbuff, ok := DropReasonValue("SOCKET_RCVBUFF")
	if !ok {
		t.Skip("no SOCKET_RCVBUFF drop reason before 5.17: every drop leaves its flow")
	}
	n := newTwoNS(t)
	full := n.serverSocket(t, serverAddr, 53)
	if err := full.SetReadBuffer(1); err != nil { // never read
		t.Fatal(err)
	}
	tr := openTier(t, Options{Attach: testTier(t)})
	c := collect(t, tr)
	conn := n.dial(t, "udp4", serverAddr, 53)
	var qnames []string
	for range 20 {
		qname := uniqueName(t)
		if _, err := conn.Write(dnsQuery(t, qname, dns.TypeA)); err != nil {
			t.Fatal(err)
		}
		qnames = append(qnames, qname)
	}
	// The last query is dropped (the socket holds a few); once its record
	// is in, every drop record is.
	last := c.query(t, qnames[len(qnames)-1])
	if _, ok := c.wait(5*time.Second, func(e *event.Event) bool { return e.Kind == event.KindDrop && e.QID == last.QID }); !ok {
		c.dump(t)
		t.Fatal("no drop record for the last query")
	}
	time.Sleep(2 * IdleEvery)
	asked := map[uint64]bool{}
	for _, qname := range qnames {
		asked[c.query(t, qname).QID] = true
	}
	dropped := map[uint64]bool{}
	for _, e := range c.all() {
		if e.Kind == event.KindDrop && asked[e.QID] {
			if e.Reason != rcvbuff {
				t.Errorf("query dropped for reason %s, want SOCKET_RCVBUFF: %s", DropReasonName(e.Reason), describe(&e))
			}
			dropped[e.QID] = true
		}
	}
	if len(dropped) == 0 || len(dropped) == len(qnames) {
		t.Fatalf("%d of %d queries dropped at the server's socket: want some taken, some dropped", len(dropped), len(qnames))
	}
	kept := 0
	forEachEntry(t, tr, "flows", func(k, v []byte) {
		qid := binary.NativeEndian.Uint64(v)
		if dropped[qid] {
			t.Errorf("query %d was dropped at its server's socket, and its flow is still held", qid)
		} else if flowNetNS(v) == n.clientIno {
			kept++
		}
	})
	if want := len(qnames) - len(dropped); kept != want {
		t.Errorf("%d flows held for the client namespace, want %d (the queries the socket took)", kept, want)
	}
}
