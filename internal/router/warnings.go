package router

import "time"

// recentWarnings remembers, per worker id, when a warning about it was last
// logged, so each is logged again no sooner than every. Entries older than
// every are dropped (at most once per every): they would hold nothing back,
// and workers come and go under new ids, so a map of every id ever warned
// about would grow for as long as the node runs.
type recentWarnings struct {
	every  time.Duration
	at     map[string]time.Time
	pruned time.Time
}

// due reports whether a warning about id may be logged at now, and if so
// records it. It allocates only when it says yes to a new id.
func (w *recentWarnings) due(id string, now time.Time) bool {
	if at, ok := w.at[id]; ok && now.Sub(at) < w.every {
		return false
	}
	if w.at == nil {
		w.at = map[string]time.Time{}
	}
	w.at[id] = now
	w.prune(now)
	return true
}

// prune drops the entries older than every, at most once per every.
func (w *recentWarnings) prune(now time.Time) {
	if len(w.at) == 0 || now.Sub(w.pruned) < w.every {
		return
	}
	w.pruned = now
	for id, at := range w.at {
		if now.Sub(at) >= w.every {
			delete(w.at, id)
		}
	}
}

// size is how many ids are remembered.
func (w *recentWarnings) size() int { return len(w.at) }

// WarnAgainEvery spaces the warnings about one worker's set-up (a pool no
// topic routes to, a forced direct dispatch it does not announce): a worker
// still set up so is named again after it.
const WarnAgainEvery = 10 * time.Minute
