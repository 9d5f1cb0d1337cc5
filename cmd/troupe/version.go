package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// buildVersion is what `troupe version` prints: the module version and the
// VCS revision the binary was built from, as Go recorded them.
type buildVersion struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
}

func readVersion() buildVersion {
	v := buildVersion{Version: "(unknown)", Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Module, v.Version = bi.Main.Path, bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (v buildVersion) print(w io.Writer) {
	fmt.Fprintf(w, "troupe %s", v.Version)
	if v.Revision != "" {
		fmt.Fprintf(w, " (revision %s", v.Revision)
		if v.Time != "" {
			fmt.Fprintf(w, ", %s", v.Time)
		}
		if v.Modified {
			fmt.Fprint(w, ", modified")
		}
		fmt.Fprint(w, ")")
	}
	fmt.Fprintf(w, " %s %s/%s\n", v.Go, runtime.GOOS, runtime.GOARCH)
}

func runVersion(_ context.Context, args []string) error {
	fs := newFlags("version")
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: troupe version [--json]   the module version and VCS revision of this binary")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	v := readVersion()
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	v.print(os.Stdout)
	return nil
}
