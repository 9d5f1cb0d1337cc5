package main

import (
	"context"
	"fmt"
)

// keys prints each concurrency key's slots and waiters (`troupe ctl keys`).
func (e *ctlEnv) keys(ctx context.Context, args []string) error {
	fs := e.flags("ctl keys")
	if _, err := e.parse(fs, args); err != nil {
		return err
	}
	l, err := e.client().ConcurrencyKeys(ctx)
	if err != nil {
		return err
	}
	if e.asJSON {
		return e.printJSON(l)
	}
	if len(l.Keys) == 0 {
		fmt.Fprintln(e.out, "no concurrency key in use")
		return nil
	}
	tw := e.table()
	fmt.Fprintln(tw, "KEY\tHOLDERS\tLINGERING\tWAITING")
	for _, k := range l.Keys {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", k.Key, k.Holders, k.Lingering, k.Waiters)
	}
	return tw.Flush()
}
