package charttest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir = "../troupe"
	repoRoot = "../../.."
)

// flagSets are the flags `troupe node -h` and `troupe worker -h` list,
// from a binary built from this checkout (or $TROUPE_BIN): name → takes
// no value (a bool flag).
var (
	flagsOnce sync.Once
	flagSets  map[string]map[string]bool
	flagsErr  error
)

// realFlags returns the flags of `troupe <cmd>`.
func realFlags(t *testing.T, cmd string) map[string]bool {
	t.Helper()
	flagsOnce.Do(func() {
		bin := os.Getenv("TROUPE_BIN")
		if bin == "" {
			bin = filepath.Join(os.TempDir(), "troupe-charttest-"+strings.ReplaceAll(time.Now().Format("150405.000000"), ".", ""))
			defer os.Remove(bin)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/troupe")
			build.Dir = repoRoot
			if out, err := build.CombinedOutput(); err != nil {
				flagsErr = &buildError{err: err, out: string(out)}
				return
			}
		}
		flagSets = map[string]map[string]bool{}
		for _, c := range []string{"node", "worker"} {
			out, err := exec.Command(bin, c, "-h").CombinedOutput()
			if err != nil {
				flagsErr = &buildError{err: err, out: string(out)}
				return
			}
			flagSets[c] = parseHelp(string(out))
		}
	})
	if flagsErr != nil {
		t.Fatalf("troupe binary: %v", flagsErr)
	}
	if len(flagSets[cmd]) < 5 {
		t.Fatalf("troupe %s -h listed %d flags; parsing its help failed", cmd, len(flagSets[cmd]))
	}
	return flagSets[cmd]
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

// Go's flag package prints each flag as "  -name type" (or "  -name" for
// a bool flag), its usage on the next lines after a tab.
var helpLine = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9_.-]*)(?: (\S+))?$`)

func parseHelp(out string) map[string]bool {
	flags := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if m := helpLine.FindStringSubmatch(line); m != nil {
			flags[m[1]] = m[2] == ""
		}
	}
	return flags
}

// checkArgs checks a container's args: the command, then flags only,
// each one the binary accepts, written --name=value (or --name for a
// bool flag). It returns the flags' values by name, in order.
func checkArgs(t *testing.T, c *corev1.Container, cmd string) map[string][]string {
	t.Helper()
	flags := realFlags(t, cmd)
	if len(c.Command) != 0 {
		t.Errorf("container %s overrides the image's entrypoint: %v", c.Name, c.Command)
	}
	if len(c.Args) == 0 || c.Args[0] != cmd {
		t.Fatalf("container %s args %v: want %q first", c.Name, c.Args, cmd)
	}
	got := map[string][]string{}
	for _, a := range c.Args[1:] {
		if err := checkFlag(flags, a); err != "" {
			t.Errorf("container %s arg %q: %s", c.Name, a, err)
			continue
		}
		name, val, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		got[name] = append(got[name], val)
	}
	return got
}

// checkFlag says what is wrong with one arg ("" : nothing).
func checkFlag(flags map[string]bool, a string) string {
	if !strings.HasPrefix(a, "--") {
		return "not a --flag"
	}
	name, _, hasVal := strings.Cut(strings.TrimPrefix(a, "--"), "=")
	isBool, ok := flags[name]
	switch {
	case !ok:
		return "troupe does not have this flag"
	case !hasVal && !isBool:
		return "the flag takes a value: write --name=value"
	}
	return ""
}

func render(t *testing.T, values string) *Objects {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(values), &v); err != nil {
		t.Fatal(err)
	}
	o, err := Render(chartDir, v)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("rendered objects invalid:\n%v", err)
	}
	return o
}

func deployment(t *testing.T, o *Objects, name string) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	d, ok := o.Deployments[name]
	if !ok {
		t.Fatalf("no Deployment %q (have %v)", name, keys(o.Deployments))
	}
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("Deployment %s has %d containers, want 1", name, n)
	}
	return d, &d.Spec.Template.Spec.Containers[0]
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// checkNonRoot checks that the pod runs as uid 65532, not root, on a
// read-only root file system, without privilege escalation.
func checkNonRoot(t *testing.T, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
	pod := d.Spec.Template.Spec.SecurityContext
	if pod == nil || pod.RunAsNonRoot == nil || !*pod.RunAsNonRoot || pod.RunAsUser == nil || *pod.RunAsUser != 65532 {
		t.Errorf("%s: pod securityContext %+v: want runAsNonRoot and runAsUser 65532", d.Name, pod)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: container root file system is writable", d.Name)
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: container may escalate privileges", d.Name)
	}
	if sc == nil || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("%s: container keeps capabilities", d.Name)
	}
}

// checkFiles checks that every file an arg names (a value under
// /etc/troupe/) is mounted, and that the key it comes from exists when
// the chart itself renders its Secret or ConfigMap. It returns the
// volume each file comes from.
func checkFiles(t *testing.T, o *Objects, d *appsv1.Deployment, c *corev1.Container, args map[string][]string) map[string]*corev1.Volume {
	t.Helper()
	from := map[string]*corev1.Volume{}
	for flag, vals := range args {
		for _, v := range vals {
			if !strings.HasPrefix(v, "/etc/troupe/") {
				continue
			}
			vol, key, ok := MountedFile(d, c, v)
			if !ok {
				t.Errorf("--%s=%s: no volume mounted there projects that file", flag, v)
				continue
			}
			from[flag] = vol
			switch {
			case vol.Secret != nil:
				if s, own := o.Secrets[vol.Secret.SecretName]; own {
					if _, ok := s.Data[key]; !ok {
						t.Errorf("--%s=%s: Secret %s has no key %q", flag, v, s.Name, key)
					}
				}
			case vol.ConfigMap != nil:
				cm, own := o.ConfigMaps[vol.ConfigMap.Name]
				if !own {
					t.Errorf("--%s=%s: ConfigMap %s is not rendered", flag, v, vol.ConfigMap.Name)
				} else if _, ok := cm.Data[key]; !ok {
					t.Errorf("--%s=%s: ConfigMap %s has no key %q", flag, v, cm.Name, key)
				}
			}
		}
	}
	return from
}

// checkProbes checks liveness on /healthz and readiness on /readyz, both
// on the port the admin server listens on.
func checkProbes(t *testing.T, d *appsv1.Deployment, c *corev1.Container, args map[string][]string, port int32) {
	t.Helper()
	if got := ContainerPort(d, "admin"); got != port {
		t.Errorf("container port admin = %d, want %d", got, port)
	}
	if want := []string{"0.0.0.0:" + itoa(port)}; strings.Join(args["admin-listen"], ",") != want[0] {
		t.Errorf("--admin-listen = %v, want %v", args["admin-listen"], want)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no %s httpGet probe", p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "admin" {
			t.Errorf("%s probe GET %s on port %s, want %s on admin", p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path)
		}
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }
