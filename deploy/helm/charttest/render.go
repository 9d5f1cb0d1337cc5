// Package charttest lints the Troupe Helm chart (deploy/helm/troupe) with
// Helm's linter, renders it with Helm's own Go packages (chart loader,
// chartutil, template engine) and checks the rendered objects: each
// decodes strictly — no unknown or duplicate fields — into its Kubernetes
// API type (k8s.io/api, the Prometheus Operator's ServiceMonitor), and the
// tests check what the chart promises against the real troupe binary's
// flags.
//
// It is a module of its own so that Helm and the Kubernetes API types
// stay out of the node's go.mod (and its vulnerability scan).
package charttest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Objects are the rendered objects of one release, by kind and name.
type Objects struct {
	Deployments     map[string]*appsv1.Deployment
	Services        map[string]*corev1.Service
	ConfigMaps      map[string]*corev1.ConfigMap
	Secrets         map[string]*corev1.Secret
	ServiceAccounts map[string]*corev1.ServiceAccount
	PDBs            map[string]*policyv1.PodDisruptionBudget
	ServiceMonitors map[string]*monitoringv1.ServiceMonitor
	// Notes is the rendered NOTES.txt.
	Notes string
}

// kinds maps each kind the chart may render to its apiVersion and a
// constructor of its typed object.
var kinds = map[string]struct {
	apiVersion string
	add        func(o *Objects, doc []byte) (string, error)
}{
	"Deployment": {"apps/v1", func(o *Objects, d []byte) (string, error) { return decode(d, o.Deployments) }},
	"Service":    {"v1", func(o *Objects, d []byte) (string, error) { return decode(d, o.Services) }},
	"ConfigMap":  {"v1", func(o *Objects, d []byte) (string, error) { return decode(d, o.ConfigMaps) }},
	"Secret":     {"v1", func(o *Objects, d []byte) (string, error) { return decode(d, o.Secrets) }},
	"ServiceAccount": {"v1", func(o *Objects, d []byte) (string, error) {
		return decode(d, o.ServiceAccounts)
	}},
	"PodDisruptionBudget": {"policy/v1", func(o *Objects, d []byte) (string, error) { return decode(d, o.PDBs) }},
	"ServiceMonitor": {"monitoring.coreos.com/v1", func(o *Objects, d []byte) (string, error) {
		return decode(d, o.ServiceMonitors)
	}},
}

// named is what every typed object has: a name.
type named interface{ GetName() string }

// decode unmarshals doc strictly (unknown or duplicate fields are errors)
// into a new T and files it under its name.
func decode[T any, P interface {
	*T
	named
}](doc []byte, into map[string]P) (string, error) {
	obj := P(new(T))
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return "", err
	}
	name := obj.GetName()
	if name == "" {
		return "", errors.New("no metadata.name")
	}
	if _, dup := into[name]; dup {
		return "", fmt.Errorf("rendered twice: %s", name)
	}
	into[name] = obj
	return name, nil
}

// Render renders the chart in chartDir as release "rel" in namespace
// "jobs" with values merged over the chart's values.yaml, strictly (a
// template that reads a value the chart does not define is an error), and
// decodes every object.
func Render(chartDir string, values map[string]any) (*Objects, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	top, err := chartutil.ToRenderValues(ch, values,
		chartutil.ReleaseOptions{Name: "rel", Namespace: "jobs", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	files, err := engine.Engine{Strict: true}.Render(ch, top)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	o := &Objects{Deployments: map[string]*appsv1.Deployment{}, Services: map[string]*corev1.Service{},
		ConfigMaps: map[string]*corev1.ConfigMap{}, Secrets: map[string]*corev1.Secret{},
		ServiceAccounts: map[string]*corev1.ServiceAccount{}, PDBs: map[string]*policyv1.PodDisruptionBudget{},
		ServiceMonitors: map[string]*monitoringv1.ServiceMonitor{}}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		switch {
		case strings.HasSuffix(name, "NOTES.txt"):
			o.Notes = files[name]
			continue
		case !strings.HasSuffix(name, ".yaml"):
			continue
		}
		if err := o.add(name, files[name]); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// add decodes every document of one rendered template file.
func (o *Objects) add(file, content string) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(content)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		k, ok := kinds[tm.Kind]
		if !ok {
			return fmt.Errorf("%s: kind %q is not one the chart renders", file, tm.Kind)
		}
		if tm.APIVersion != k.apiVersion {
			return fmt.Errorf("%s: %s has apiVersion %q, want %q", file, tm.Kind, tm.APIVersion, k.apiVersion)
		}
		if _, err := k.add(o, doc); err != nil {
			return fmt.Errorf("%s: %s: %w\n%s", file, tm.Kind, err, numbered(doc))
		}
	}
}

// numbered returns doc with line numbers, for error messages.
func numbered(doc []byte) string {
	var b strings.Builder
	for i, line := range strings.Split(string(doc), "\n") {
		fmt.Fprintf(&b, "%4d  %s\n", i+1, line)
	}
	return b.String()
}
