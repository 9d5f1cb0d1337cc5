package store

// A write that gives a job's lock up (a terminal or releasing transition,
// a release, a park) deletes or changes the lock in Redis before its job
// actor hears the outcome and unregisters the lock from the renewer. A
// renewal round that reached Redis in between found the lock gone and
// reported it lost — to a job that had let it go itself (under load, with
// writes and actor messages seconds behind, that was hundreds of reports
// per round at the end of a large hold). So the Writer marks the lock as
// releasing while such a write is in flight, and unregisters it the moment
// the write's reply says it applied; a renewal refused meanwhile drops the
// lock without a loss report. If the write does not apply (fenced, or
// Redis not reached) the mark goes and the lock is renewed as before; a
// lock that was refused meanwhile is not renewed any more, and the job's
// write, fenced, tells it so.

func (s *Store) addRenewer(r *LockRenewer) {
	for {
		old := s.renewers.Load()
		var next []*LockRenewer
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, r)
		if s.renewers.CompareAndSwap(old, &next) {
			return
		}
	}
}

// releasesLock reports whether op gives its lock up if it applies.
func releasesLock(op *Op) bool {
	switch op.Kind {
	case OpRelease, OpPark:
		return true
	case OpTransition:
		return op.T != nil && !op.T.LockKept()
	}
	return false
}

// released reports whether r says op gave its lock up.
func released(op *Op, r *Result) bool {
	if r == nil || r.Err != nil {
		return false
	}
	switch op.Kind {
	case OpRelease:
		return r.Released
	case OpPark:
		return r.Parked
	case OpTransition:
		return r.Step == StepOK || op.applied(r)
	}
	return false
}

// markReleasing marks (or, with on false, unmarks) the lock of each op in
// batch that gives its lock up if it applies.
func (s *Store) markReleasing(batch []*Op, on bool) {
	rs := s.renewers.Load()
	if rs == nil {
		return
	}
	for _, op := range batch {
		if op.LockValue == "" || !releasesLock(op) {
			continue
		}
		if h := heldBy(op, *rs); h != nil {
			h.r.markHeld(h, on)
			continue
		}
		for _, r := range *rs {
			r.mark(op.JobID, op.LockValue, on)
		}
	}
}

// heldBy is op's Held when it stands for op's lock in the store's one
// renewer (the node's): the handle then reaches the same entry as a
// look-up of op's job and lock value would. With several renewers on one
// store (tests), every renewer is looked up, as before.
func heldBy(op *Op, rs []*LockRenewer) *HeldLock {
	if h := op.Held; h != nil && len(rs) == 1 && h.r == rs[0] && h.id == op.JobID && h.value == op.LockValue {
		return h
	}
	return nil
}

// settleReleasing, once batch's replies are in, unregisters the locks its
// writes gave up and unmarks the others.
func (s *Store) settleReleasing(batch []*Op, results []*Result) {
	rs := s.renewers.Load()
	if rs == nil {
		return
	}
	for i, op := range batch {
		if op.LockValue == "" || !releasesLock(op) {
			continue
		}
		gone := released(op, results[i])
		if h := heldBy(op, *rs); h != nil {
			if gone {
				h.r.ForgetHeld(h)
			} else {
				h.r.markHeld(h, false)
			}
			continue
		}
		for _, r := range *rs {
			if gone {
				r.Forget(op.JobID, op.LockValue)
			} else {
				r.mark(op.JobID, op.LockValue, false)
			}
		}
	}
}

// mark adds (on) or removes one in-flight releasing write on jobID's lock,
// if value is the one held.
func (r *LockRenewer) mark(jobID, value string, on bool) {
	r.mu.Lock()
	if h, ok := r.locks[jobID]; ok && h.value == value {
		h.markLocked(on)
	}
	r.mu.Unlock()
}

// markHeld is mark for h's lock, if it is still registered, without a
// look-up.
func (r *LockRenewer) markHeld(h *HeldLock, on bool) {
	r.mu.Lock()
	if h.live {
		h.markLocked(on)
	}
	r.mu.Unlock()
}

// markLocked adds (on) or removes one in-flight releasing write; r.mu is
// held.
func (h *HeldLock) markLocked(on bool) {
	switch {
	case on:
		h.releasing++
	case h.releasing > 0:
		h.releasing--
	}
}
