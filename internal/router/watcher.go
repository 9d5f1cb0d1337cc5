package router

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// PoolsPollDefault is how often the PoolsWatcher re-reads pools.yaml and
// the runtime mapping version: a config change reaches every replica within
// about a second, for one small file read and one Redis GET per second.
const PoolsPollDefault = time.Second

// poolsIOTimeout bounds one reload's Redis calls, so a hung Redis cannot
// stall a SIGHUP reload of the file.
const poolsIOTimeout = 2 * time.Second

// PoolsWatcherConfig configures a PoolsWatcher.
type PoolsWatcherConfig struct {
	// Path is the pools.yaml to watch. Empty: Base is the file config.
	Path string
	// Base is the file config when Path is empty (an embedder that builds
	// its PoolConfig in code still gets runtime mappings).
	Base *PoolConfig
	// Mappings, when set, supplies runtime topic → pools mappings, laid over
	// the file config (runtime wins).
	Mappings *MappingStore
	// Poll is how often the file and the mapping version are checked
	// (default PoolsPollDefault).
	Poll time.Duration
	// Log receives reload lines (default slog.Default()).
	Log *slog.Logger
	// Extra, when set, parses the file's sections the router does not read
	// (the node's rate limit buckets); a file it rejects is rejected whole,
	// as one with an invalid routing section is.
	Extra func(data []byte) (any, error)
	// OnApply, when set, hears every config the watcher loads or applies,
	// with Extra's result for the file in force (nil without a Path or an
	// Extra), before the router does; it runs under the watcher's lock and
	// must not block.
	OnApply func(cfg *PoolConfig, extra any)
}

// PoolsWatcher keeps the router's pool config current. It re-reads
// pools.yaml when its content changes (checked every Poll by hash: mtime
// alone misses same-second rewrites, and ConfigMap symlink swaps keep the
// old mtime on the link) or on demand (Reload, which the node calls on
// SIGHUP), and reloads the runtime mappings when their version moves. Each
// new merged config goes to the router as a *SetPools.
//
// An invalid file never replaces a good config: the watcher keeps the last
// good one and logs why, naming the line, once per distinct bad content.
type PoolsWatcher struct {
	// Immutable after construction.
	cfg PoolsWatcherConfig
	log *slog.Logger

	// Guarded by mu: Reload may run on a signal goroutine while the poll
	// loop runs.
	mu          sync.Mutex
	file        *PoolConfig
	extra       any // Extra's result for file
	fileHash    [sha256.Size]byte
	lastFileErr string
	runtime     Mappings
	haveRuntime bool
	lastMapErr  string
	current     *PoolConfig
	deliver     func(*PoolConfig)

	startOnce sync.Once
	stopOnce  sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// NewPoolsWatcher returns a watcher that has loaded nothing yet; call Load.
func NewPoolsWatcher(cfg PoolsWatcherConfig) (*PoolsWatcher, error) {
	if cfg.Path == "" && cfg.Base == nil {
		return nil, errors.New("router: pools watcher needs Path or Base")
	}
	if cfg.Poll <= 0 {
		cfg.Poll = PoolsPollDefault
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	w := &PoolsWatcher{cfg: cfg, log: cfg.Log.With("component", "pools"), file: cfg.Base,
		stop: make(chan struct{}), done: make(chan struct{})}
	return w, nil
}

// Load reads the file and the runtime mappings and returns the merged
// config to spawn the router with. A missing or invalid file is an error
// (there is no older config to keep); an unreachable Redis is logged and
// the file config is used alone until the next poll reaches it.
func (w *PoolsWatcher) Load(ctx context.Context) (*PoolConfig, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cfg.Path != "" {
		data, err := os.ReadFile(w.cfg.Path)
		if err != nil {
			return nil, fmt.Errorf("pools: %w", err)
		}
		cfg, extra, err := w.parse(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.cfg.Path, err)
		}
		w.file, w.extra, w.fileHash = cfg, extra, sha256.Sum256(data)
	}
	w.loadMappings(ctx, true)
	w.current = w.file.WithMappings(w.runtime.Topics).WithPaused(w.runtime.Paused)
	if w.cfg.OnApply != nil {
		w.cfg.OnApply(w.current, w.extra)
	}
	return w.current, nil
}

// Start begins polling and sends every new config to router as a
// *SetPools. Call it once, after Load and after spawning the router.
func (w *PoolsWatcher) Start(root *actor.RootContext, router *actor.PID) {
	w.start(func(cfg *PoolConfig) { root.Send(router, &SetPools{Config: cfg}) })
}

func (w *PoolsWatcher) start(deliver func(*PoolConfig)) {
	w.startOnce.Do(func() {
		w.mu.Lock()
		w.deliver = deliver
		w.mu.Unlock()
		go w.loop()
	})
}

func (w *PoolsWatcher) loop() {
	defer close(w.done)
	t := time.NewTicker(w.cfg.Poll)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			_ = w.reload(false)
		}
	}
}

// Stop ends polling and waits for the poll goroutine. Safe to call more
// than once, and without Start.
func (w *PoolsWatcher) Stop() {
	w.stopOnce.Do(func() {
		close(w.stop)
		started := true
		w.startOnce.Do(func() { started = false })
		if started {
			<-w.done
		}
	})
}

// Reload re-reads the file and the runtime mappings now (the node calls it
// on SIGHUP) and delivers the result if it changed. The error says why the
// file was rejected; the old config stays in force.
func (w *PoolsWatcher) Reload() error { return w.reload(true) }

// Current returns the config last loaded or delivered.
func (w *PoolsWatcher) Current() *PoolConfig {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

func (w *PoolsWatcher) reload(onDemand bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), poolsIOTimeout)
	defer cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	changed, fileErr := w.reloadFile(onDemand)
	if w.loadMappings(ctx, onDemand) {
		changed = true
	}
	if changed && w.file != nil {
		w.current = w.file.WithMappings(w.runtime.Topics).WithPaused(w.runtime.Paused)
		w.log.Info("pools config applied", "topics", len(w.current.Topics), "pools", len(w.current.Pools),
			"runtime_mappings", len(w.runtime.Topics), "mapping_version", w.runtime.Version)
		if w.cfg.OnApply != nil {
			w.cfg.OnApply(w.current, w.extra)
		}
		if w.deliver != nil {
			w.deliver(w.current)
		}
	}
	return fileErr
}

// reloadFile reports whether the file brought a new valid config. A failure
// is logged once per distinct error unless the reload was asked for.
func (w *PoolsWatcher) reloadFile(onDemand bool) (bool, error) {
	if w.cfg.Path == "" {
		return false, nil
	}
	data, err := os.ReadFile(w.cfg.Path)
	if err == nil {
		h := sha256.Sum256(data)
		if h == w.fileHash && w.file != nil {
			w.lastFileErr = ""
			return false, nil
		}
		var (
			cfg   *PoolConfig
			extra any
		)
		if cfg, extra, err = w.parse(data); err == nil {
			w.file, w.extra, w.fileHash, w.lastFileErr = cfg, extra, h, ""
			w.log.Info("pools file reloaded", "path", w.cfg.Path)
			return true, nil
		}
		err = fmt.Errorf("%s: %w", w.cfg.Path, err)
	} else {
		err = fmt.Errorf("pools: %w", err)
	}
	if onDemand || err.Error() != w.lastFileErr {
		w.log.Error("pools file rejected; keeping the previous config", "path", w.cfg.Path, "err", err)
	}
	w.lastFileErr = err.Error()
	return false, err
}

// parse reads a pools file: the routing config and Extra's sections.
func (w *PoolsWatcher) parse(data []byte) (*PoolConfig, any, error) {
	cfg, err := ParsePools(data)
	if err != nil || w.cfg.Extra == nil {
		return cfg, nil, err
	}
	extra, err := w.cfg.Extra(data)
	if err != nil {
		return nil, nil, err
	}
	return cfg, extra, nil
}

// loadMappings reloads the runtime mappings when their version moved and
// reports whether they changed. Redis trouble keeps the last mappings.
func (w *PoolsWatcher) loadMappings(ctx context.Context, onDemand bool) bool {
	if w.cfg.Mappings == nil {
		return false
	}
	fail := func(err error) bool {
		if onDemand || err.Error() != w.lastMapErr {
			w.log.Warn("runtime pool mappings unavailable; keeping the last ones", "err", err)
		}
		w.lastMapErr = err.Error()
		return false
	}
	if w.haveRuntime {
		v, err := w.cfg.Mappings.Version(ctx)
		if err != nil {
			return fail(err)
		}
		if v == w.runtime.Version {
			w.lastMapErr = ""
			return false
		}
	}
	m, err := w.cfg.Mappings.Load(ctx)
	if err != nil {
		return fail(err)
	}
	w.runtime, w.haveRuntime, w.lastMapErr = m, true, ""
	return true
}
