package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/troupe-run/troupe/router"
)

// runPool manages the runtime topic → pool mappings every replica reads from
// Redis (they override pools.yaml and are picked up within about a second).
//
//	troupe pool list
//	troupe pool map <topic> <pool>[,<pool>...]
//	troupe pool unmap <topic>
func runPool(ctx context.Context, args []string) error {
	fs := newFlags("pool")
	var c common
	c.register(fs, false, true)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rdb, err := c.dialRedis(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	ms := router.NewMappingStore(rdb, c.keyPrefix)
	a := fs.Args()
	if len(a) == 0 {
		a = []string{"list"}
	}
	switch a[0] {
	case "list":
		m, err := ms.Load(ctx)
		if err != nil {
			return err
		}
		if len(m.Topics) == 0 {
			fmt.Println("no runtime mappings (pools.yaml applies)")
			return nil
		}
		topics := make([]string, 0, len(m.Topics))
		for t := range m.Topics {
			topics = append(topics, t)
		}
		sort.Strings(topics)
		fmt.Printf("%-32s %s   (version %d)\n", "TOPIC", "POOLS", m.Version)
		for _, t := range topics {
			fmt.Printf("%-32s %s\n", t, strings.Join(m.Topics[t], ","))
		}
	case "map":
		if len(a) != 3 {
			return errors.New("usage: troupe pool map <topic> <pool>[,<pool>...]")
		}
		if err := ms.Set(ctx, a[1], strings.Split(a[2], ",")...); err != nil {
			return err
		}
		fmt.Printf("%s → %s (every replica within ~1 s)\n", a[1], a[2])
	case "unmap":
		if len(a) != 2 {
			return errors.New("usage: troupe pool unmap <topic>")
		}
		if err := ms.Delete(ctx, a[1]); err != nil {
			return err
		}
		fmt.Printf("%s unmapped at run time (pools.yaml applies again)\n", a[1])
	default:
		return fmt.Errorf("unknown pool command %q (list, map, unmap)", a[0])
	}
	return nil
}
