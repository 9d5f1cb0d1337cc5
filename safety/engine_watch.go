package safety

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"
)

// maxPolicyBytes bounds a policy file: a kernel must not be made to read a
// log file someone pointed it at. Real policies are a few KiB.
const maxPolicyBytes = 8 << 20

func readPolicyFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("safety policy: %w", err)
	}
	if st.Size() > maxPolicyBytes {
		return nil, fmt.Errorf("safety policy %s: %d bytes, more than the %d allowed", path, st.Size(), maxPolicyBytes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safety policy: %w", err)
	}
	return data, nil
}

// watch re-reads the file every Poll. It compares content hashes rather
// than trusting mtime alone: a rewrite within the same second keeps the
// mtime, and a ConfigMap's symlink swap keeps the link's. Reading a policy
// file once a second costs microseconds.
func (e *Engine) watch() {
	defer close(e.done)
	t := time.NewTicker(e.cfg.Poll)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			_ = e.Reload()
		}
	}
}

// Reload re-reads the policy file now (the node calls it on SIGHUP). An
// unchanged file is a no-op. An unreadable or invalid file keeps the
// version in force; the error, naming the line, is returned and logged
// once per distinct bad content.
func (e *Engine) Reload() error {
	if e.cfg.Path == "" {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	cur := e.cur.Load()
	data, err := readPolicyFile(e.cfg.Path)
	if err != nil {
		if e.lastBad != err.Error() {
			e.lastBad = err.Error()
			e.log.Warn("safety policy unreadable; keeping the version in force", "snapshot", cur.Snapshot, "err", err)
			e.notify(cur, err)
		}
		return err
	}
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	if hash == cur.Hash {
		e.lastBad = ""
		return nil
	}
	p, err := ParsePolicy(data)
	if err == nil {
		err = e.checkLocked(p)
	}
	if err != nil {
		if e.lastBad != hash {
			e.lastBad = hash
			line := 0
			var pe *PolicyError
			if errors.As(err, &pe) {
				line = pe.Line
			}
			e.log.Warn("safety policy change refused; keeping the version in force",
				"snapshot", cur.Snapshot, "line", line, "err", err)
			e.notify(cur, err)
		}
		return err
	}
	e.lastBad = ""
	e.installLocked(p)
	e.log.Info("safety policy reloaded", "snapshot", p.Snapshot, "previous", cur.Snapshot, "rules", p.Rules())
	for b := range e.binds {
		if b.applied != nil {
			b.applied(p)
		}
	}
	e.notify(p, nil)
	return nil
}

func (e *Engine) notify(p *Policy, err error) {
	if e.cfg.OnReload != nil {
		e.cfg.OnReload(p, err)
	}
}
