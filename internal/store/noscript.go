package store

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Scripts sent with EVALSHA need Redis's script cache to hold them. After a
// restart or a SCRIPT FLUSH, Redis answers NOSCRIPT instead. go-redis's
// Script.Run falls back to EVAL by itself, but only for a command sent on
// its own; a pipeline's EVALSHAs get no such fallback. Every pipeline of
// EVALSHAs in this package therefore goes through sendScripts.

// sentItem is one item's outcome in sendScripts.
type sentItem struct {
	// cmds are the commands queued for the item by its last send.
	cmds []redis.Cmder
	// err is the error that Exec returned for the pipeline the item was
	// last sent in: the first failed command of that pipeline, which need
	// not be one of the item's own.
	err error
}

// sendScripts sends n items in one pipeline: queue adds item i's commands
// to pipe and returns them. If Redis answered NOSCRIPT to any command of an
// item, sendScripts loads every script (LoadScripts) and sends those items
// once more, in a second pipeline; the other items are not sent again. It
// returns each item's outcome, and LoadScripts' error if the scripts could
// not be loaded: the items that met NOSCRIPT were then not sent again, and
// their commands still hold the NOSCRIPT error.
func (s *Store) sendScripts(ctx context.Context, n int,
	queue func(pipe redis.Pipeliner, i int) []redis.Cmder) ([]sentItem, error) {
	items := make([]sentItem, n)
	todo := make([]int, n)
	for i := range todo {
		todo[i] = i
	}
	for try := 0; len(todo) > 0; try++ {
		pipe := s.rdb.Pipeline()
		for _, i := range todo {
			items[i].cmds = queue(pipe, i)
		}
		_, err := pipe.Exec(ctx)
		var again []int
		for _, i := range todo {
			items[i].err = err
			if try == 0 && noScript(items[i].cmds) {
				again = append(again, i)
			}
		}
		if len(again) > 0 {
			if lerr := s.loadScripts(ctx); lerr != nil {
				return items, lerr
			}
		}
		todo = again
	}
	return items, nil
}

// noScript reports whether any of cmds failed with NOSCRIPT.
func noScript(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if isNoScript(c.Err()) {
			return true
		}
	}
	return false
}

// isNoScript reports whether err is Redis's NOSCRIPT: an EVALSHA of a
// script that is not in Redis's script cache (after a restart or a SCRIPT
// FLUSH). LoadScripts and a second send fix it.
func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }
