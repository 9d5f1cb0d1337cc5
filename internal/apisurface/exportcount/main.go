// Command exportcount prints the exported identifiers of each package
// directory given (the rule is in package apisurface's comment), one line
// per package and a total: scripts/exported-count.sh runs it over the
// public packages. With -internal it lists instead the internal types
// their exported signatures name.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/troupe-run/troupe/internal/apisurface"
)

func main() {
	internal := flag.Bool("internal", false, "list the internal types exported signatures name")
	flag.Parse()
	if *internal {
		for _, dir := range flag.Args() {
			p, err := apisurface.Parse(dir)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			for _, r := range p.InternalRefs() {
				fmt.Printf("%s: %s\n", dir, r)
			}
		}
		return
	}
	total := 0
	fmt.Printf("%-22s %6s %6s %6s %6s %7s %6s %6s\n", "package", "const", "var", "func", "type", "method", "field", "total")
	for _, dir := range flag.Args() {
		p, err := apisurface.Parse(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		c := p.Count()
		fmt.Printf("%-22s %6d %6d %6d %6d %7d %6d %6d\n", dir, c.Consts, c.Vars, c.Funcs, c.Types, c.Methods, c.Fields, c.Total())
		total += c.Total()
	}
	fmt.Printf("%-22s %6s %6s %6s %6s %7s %6s %6d\n", "total", "", "", "", "", "", "", total)
}
