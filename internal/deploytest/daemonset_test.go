package deploytest

import (
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Manifest is the DaemonSet file, relative to this package.
const Manifest = "../../scripts/daemonset.yaml"

func load(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	b, err := os.ReadFile(Manifest)
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatalf("decoding %s strictly: %v", Manifest, err)
	}
	return &ds
}

func TestStrictDecodingCatchesTypos(t *testing.T) {
	b, err := os.ReadFile(Manifest)
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(b), "readOnlyRootFilesystem:", "readOnlyRootFilesytem:", 1)
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict([]byte(bad), &ds); err == nil {
		t.Fatal("a misspelt field decoded without error: the strict check checks nothing")
	}
}

func TestDaemonSet(t *testing.T) {
	ds := load(t)
	if ds.APIVersion != "apps/v1" || ds.Kind != "DaemonSet" {
		t.Errorf("apiVersion/kind %s/%s", ds.APIVersion, ds.Kind)
	}
	spec := ds.Spec.Template.Spec
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the template's labels", k, v)
		}
	}
	if !spec.HostNetwork {
		t.Error("hostNetwork: want true (metrics on the node's address)")
	}
	if spec.HostPID || spec.HostIPC {
		t.Error("hostPID/hostIPC: not needed, /host/proc is mounted")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken: want false (no API server access)")
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Operator == corev1.TolerationOpExists && tl.Key == "" && tl.Effect == ""
	}) {
		t.Error("no toleration of every taint (operator: Exists)")
	}
	ann := ds.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != "9153" || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v", ann)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "trace" {
		t.Errorf("args %v: want dnsrace trace", c.Args)
	}
	has := func(prefix string) bool {
		return slices.ContainsFunc(c.Args, func(a string) bool { return a == prefix || strings.HasPrefix(a, prefix+"=") })
	}
	for _, f := range []string{"--metrics-addr", "--json", "--proc-root", "--root"} {
		if !has(f) {
			t.Errorf("args %v lack %s", c.Args, f)
		}
	}
	if !slices.Contains(c.Args, "--metrics-addr=:9153") || len(c.Ports) != 1 || c.Ports[0].ContainerPort != 9153 {
		t.Errorf("metrics port: args %v, ports %v", c.Args, c.Ports)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Limits[r]; !ok || q.IsZero() {
			t.Errorf("no %s limit", r)
		}
		if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
			t.Errorf("no %s request", r)
		}
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("no securityContext")
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Error("privileged: want an explicit false")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation: want false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem: want true")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Fatalf("capabilities: want drop [ALL]")
	}
	add := slices.Clone(sc.Capabilities.Add)
	slices.Sort(add)
	want := []corev1.Capability{"BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"}
	if !slices.Equal(add, want) {
		t.Errorf("capabilities added %v, want %v (each justified in the manifest)", add, want)
	}
	// Every host path is mounted read-only, and only these.
	paths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			t.Errorf("volume %s is not a hostPath", v.Name)
			continue
		}
		paths[v.Name] = v.HostPath.Path
	}
	mounted := map[string]string{}
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly {
			t.Errorf("mount %s at %s is writable", m.Name, m.MountPath)
		}
		mounted[paths[m.Name]] = m.MountPath
	}
	for host, at := range map[string]string{
		"/sys/kernel/btf":     "/sys/kernel/btf",
		"/proc":               "/host/proc",
		"/sys/fs/cgroup":      "/host/sys/fs/cgroup",
		"/var/log/pods":       "/host/var/log/pods",
		"/var/log/containers": "/host/var/log/containers",
	} {
		if mounted[host] != at {
			t.Errorf("host %s mounted at %q, want %s", host, mounted[host], at)
		}
	}
	if len(mounted) != 5 {
		t.Errorf("%d host mounts, want 5: %v", len(mounted), mounted)
	}
}
