package doctor

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

const (
	resolvedUplink = "/run/systemd/resolve/resolv.conf"
	resolvedStub   = "/run/systemd/resolve/stub-resolv.conf"
	kubeletConfig  = "/var/lib/kubelet/config.yaml"
)

var stubAddr = netip.MustParseAddr("127.0.0.53")

// checkResolvers: does the node's resolv.conf (and the one kubelet hands to
// dnsPolicy=Default pods and to CoreDNS) list a nameserver that can answer?
// The Flatcar + Azure CNI bridge case leaves "# No DNS servers known." in
// systemd-resolved's uplink file, which /etc/resolv.conf links to.
func checkResolvers(_ context.Context, e *env) Result {
	r := Result{}
	data, chain, err := e.read("/etc/resolv.conf")
	r.Evidence = append(r.Evidence, chain...)
	if err != nil {
		return Result{Verdict: Skip, Reason: err.Error(), Evidence: r.Evidence}
	}
	rc, err := ParseResolvConf(data)
	if err != nil {
		return Result{Verdict: Skip, Reason: "/etc/resolv.conf: " + err.Error(), Evidence: r.Evidence}
	}
	var probs problems
	fix := "give the node working upstream servers: stop systemd-networkd from managing the CNI bridge " +
		"(see bridge-takeover), or set DNS= in /etc/systemd/resolved.conf (Azure: DNS=168.63.129.16), " +
		"then `systemctl restart systemd-resolved` and check `resolvectl status`"

	r.Evidence = append(r.Evidence, describeResolv("/etc/resolv.conf", rc)...)
	for _, bad := range rc.BadNameservers {
		r.Evidence = append(r.Evidence, fmt.Sprintf("/etc/resolv.conf: ignored line %q", bad))
	}
	switch {
	case len(rc.Nameservers) == 0:
		r.Verdict, r.Fix = Fail, fix
		r.Summary = "/etc/resolv.conf has no nameserver"
		if rc.commentMentions("No DNS servers known") {
			r.Summary += ` ("No DNS servers known.")`
		}
	case onlyStub(rc):
		// The stub is only as good as resolved's uplink list.
		up, upChain, err := e.read(resolvedUplink)
		r.Evidence = append(r.Evidence, upChain...)
		if err != nil {
			probs.addf("stub resolver 127.0.0.53 in use but its uplink list is unreadable: %v", err)
			r.Verdict, r.Summary = OK, "/etc/resolv.conf points at the systemd-resolved stub"
			break
		}
		urc, err := ParseResolvConf(up)
		if err != nil {
			probs.addf("%s: %v", resolvedUplink, err)
			r.Verdict, r.Summary = OK, "/etc/resolv.conf points at the systemd-resolved stub"
			break
		}
		r.Evidence = append(r.Evidence, describeResolv(resolvedUplink, urc)...)
		if len(urc.Nameservers) == 0 {
			r.Verdict, r.Fix = Fail, fix
			r.Summary = "systemd-resolved stub 127.0.0.53 has no uplink servers"
			if urc.commentMentions("No DNS servers known") {
				r.Summary += ` ("No DNS servers known.")`
			}
		} else {
			r.Verdict = OK
			r.Summary = fmt.Sprintf("stub 127.0.0.53 with %d uplink server(s): %s", len(urc.Nameservers), strings.Join(urc.NameserverStrings(), " "))
		}
	default:
		r.Verdict = OK
		r.Summary = fmt.Sprintf("%d nameserver(s): %s", len(rc.Nameservers), strings.Join(rc.NameserverStrings(), " "))
		// A static /etc/resolv.conf can hide that systemd-resolved itself
		// lost its uplinks: its stub and its uplink file (kubelet's
		// default on resolved nodes) then answer nothing.
		if up, _, err := e.read(resolvedUplink); err == nil {
			if urc, err := ParseResolvConf(up); err == nil && len(urc.Nameservers) == 0 {
				r.Evidence = append(r.Evidence, describeResolv(resolvedUplink, urc)...)
				r.Verdict, r.Fix = Warn, fix
				r.Summary += "; but systemd-resolved has no uplink servers (its stub 127.0.0.53 and " + resolvedUplink + " answer nothing)"
			}
		}
	}

	// kubelet's --resolv-conf is what CoreDNS forwards to and what
	// dnsPolicy=Default pods get; on systemd-resolved nodes it is the
	// uplink file, which can be empty while /etc/resolv.conf looks fine.
	if kc, _, err := e.read(kubeletConfig); err == nil {
		if m := regexp.MustCompile(`(?m)^resolvConf:\s*"?([^"\s]+)"?`).FindSubmatch(kc); m != nil {
			kp := string(m[1])
			r.Evidence = append(r.Evidence, fmt.Sprintf("%s: resolvConf: %s", kubeletConfig, kp))
			if kp != "/etc/resolv.conf" {
				kd, kchain, err := e.read(kp)
				r.Evidence = append(r.Evidence, kchain...)
				if err != nil {
					probs.addf("kubelet resolvConf %s: %v", kp, err)
				} else if krc, err := ParseResolvConf(kd); err != nil {
					probs.addf("kubelet resolvConf %s: %v", kp, err)
				} else if len(krc.Nameservers) == 0 || onlyStub(krc) {
					r.Evidence = append(r.Evidence, describeResolv(kp, krc)...)
					if r.Verdict != Fail {
						// The node's own file failing is the headline;
						// otherwise kubelet's is.
						r.Summary = fmt.Sprintf("kubelet's resolvConf %s has no usable nameserver (CoreDNS upstream and dnsPolicy=Default pods)", kp)
					}
					r.Verdict, r.Fix = Fail, fix
				}
			}
		}
	}
	if r.Verdict == Fail && e.Live && e.Root == "/" {
		r.Evidence = append(r.Evidence, resolvectlDNS()...)
	}
	return probs.finish(r)
}

// resolvectlDNS adds systemd-resolved's own per-link view when it is there
// to ask (live, on the node itself). The files above are the evidence;
// this only helps a reader see which link lost its servers.
func resolvectlDNS() []string {
	if _, err := exec.LookPath("resolvectl"); err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "resolvectl", "dns").Output()
	if err != nil {
		return []string{"resolvectl dns: " + err.Error()}
	}
	var ev []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if len(ev) == 8 {
			ev = append(ev, "resolvectl dns: ...")
			break
		}
		ev = append(ev, "resolvectl dns: "+strings.TrimSpace(l))
	}
	return ev
}

func onlyStub(rc ResolvConf) bool {
	if len(rc.Nameservers) == 0 {
		return false
	}
	for _, a := range rc.Nameservers {
		if a != stubAddr {
			return false
		}
	}
	return true
}

// describeResolv renders the lines of rc that matter.
func describeResolv(name string, rc ResolvConf) []string {
	var out []string
	if len(rc.Nameservers) == 0 {
		out = append(out, name+": no nameserver lines")
	} else {
		out = append(out, name+": nameserver "+strings.Join(rc.NameserverStrings(), ", "))
	}
	for _, c := range rc.Comments {
		if strings.Contains(c, "No DNS servers known") {
			out = append(out, fmt.Sprintf("%s: # %s", name, c))
		}
	}
	if len(rc.Options) > 0 {
		out = append(out, name+": options "+rc.OptionsString())
	}
	return out
}
