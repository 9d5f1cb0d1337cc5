package charttest

import (
	"errors"
	"fmt"
	"path"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Validate checks what the API server would refuse beyond the field
// names strict decoding already checked: object and port names, a
// Deployment whose selector does not select its own pods, mounts of
// volumes that do not exist, probes on ports the container does not
// name, and a Service whose target port no node container names.
func (o *Objects) Validate() error {
	var errs []error
	check := func(kind, name string) {
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			errs = append(errs, fmt.Errorf("%s %q: %s", kind, name, msg))
		}
	}
	for name, d := range o.Deployments {
		check("Deployment", name)
		errs = append(errs, validateDeployment(d)...)
	}
	for name, s := range o.Services {
		check("Service", name)
		errs = append(errs, o.validateService(s)...)
	}
	for name := range o.ConfigMaps {
		check("ConfigMap", name)
	}
	for name := range o.Secrets {
		check("Secret", name)
	}
	for name := range o.ServiceAccounts {
		check("ServiceAccount", name)
	}
	for name := range o.PDBs {
		check("PodDisruptionBudget", name)
	}
	for name := range o.ServiceMonitors {
		check("ServiceMonitor", name)
	}
	return errors.Join(errs...)
}

func validateDeployment(d *appsv1.Deployment) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("Deployment %s: "+format, append([]any{d.Name}, args...)...))
	}
	if d.Spec.Selector == nil || len(d.Spec.Selector.MatchLabels) == 0 {
		fail("no selector")
	} else if !labels.SelectorFromSet(d.Spec.Selector.MatchLabels).Matches(labels.Set(d.Spec.Template.Labels)) {
		fail("selector %v does not select the pod template's labels %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	pod := d.Spec.Template.Spec
	volumes := map[string]bool{}
	for _, v := range pod.Volumes {
		if volumes[v.Name] {
			fail("volume %q twice", v.Name)
		}
		volumes[v.Name] = true
	}
	if len(pod.Containers) == 0 {
		fail("no containers")
	}
	for _, c := range pod.Containers {
		ports := map[string]bool{}
		for _, p := range c.Ports {
			for _, msg := range validation.IsValidPortName(p.Name) {
				fail("container %s port %q: %s", c.Name, p.Name, msg)
			}
			for _, msg := range validation.IsValidPortNum(int(p.ContainerPort)) {
				fail("container %s port %d: %s", c.Name, p.ContainerPort, msg)
			}
			ports[p.Name] = true
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				fail("container %s mounts volume %q, which the pod does not have", c.Name, m.Name)
			}
			if !path.IsAbs(m.MountPath) {
				fail("container %s mount path %q is not absolute", c.Name, m.MountPath)
			}
		}
		for kind, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			if p == nil || p.HTTPGet == nil {
				continue
			}
			if p.HTTPGet.Port.Type == intstr.String && !ports[p.HTTPGet.Port.StrVal] {
				fail("container %s %s probe on port %q, which it does not name", c.Name, kind, p.HTTPGet.Port.StrVal)
			}
		}
		for _, e := range c.Env {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				fail("container %s env %q: %s", c.Name, e.Name, msg)
			}
		}
	}
	return errs
}

func (o *Objects) validateService(s *corev1.Service) []error {
	var errs []error
	sel := labels.SelectorFromSet(s.Spec.Selector)
	var selected []*appsv1.Deployment
	for _, d := range o.Deployments {
		if len(s.Spec.Selector) > 0 && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			selected = append(selected, d)
		}
	}
	if len(selected) == 0 {
		return []error{fmt.Errorf("Service %s selects no Deployment's pods", s.Name)}
	}
	for _, p := range s.Spec.Ports {
		if p.TargetPort.Type != intstr.String {
			continue
		}
		for _, d := range selected {
			if ContainerPort(d, p.TargetPort.StrVal) == 0 {
				errs = append(errs, fmt.Errorf("Service %s: target port %q is named by no container of %s", s.Name, p.TargetPort.StrVal, d.Name))
			}
		}
	}
	return errs
}

// ContainerPort returns the number of the port called name in d's pods
// (0: none).
func ContainerPort(d *appsv1.Deployment, name string) int32 {
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
	}
	return 0
}

// MountedFile says where the file at path in container c of d comes
// from: the volume mounted at its directory and the key it projects
// there (a Secret's or ConfigMap's item, or the file name when the
// volume projects every key). ok is false when no mount holds path.
func MountedFile(d *appsv1.Deployment, c *corev1.Container, file string) (vol *corev1.Volume, key string, ok bool) {
	dir, base := path.Split(file)
	dir = strings.TrimSuffix(dir, "/")
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir || m.SubPath != "" {
			continue
		}
		for i := range d.Spec.Template.Spec.Volumes {
			v := &d.Spec.Template.Spec.Volumes[i]
			if v.Name != m.Name {
				continue
			}
			var items []corev1.KeyToPath
			switch {
			case v.Secret != nil:
				items = v.Secret.Items
			case v.ConfigMap != nil:
				items = v.ConfigMap.Items
			default:
				return v, "", false
			}
			if len(items) == 0 {
				return v, base, true
			}
			for _, it := range items {
				if it.Path == base {
					return v, it.Key, true
				}
			}
			return v, "", false
		}
	}
	return nil, "", false
}
