package bus

import "testing"

// IsWorker answers what comparing with Worker answers, for subjects that
// differ from a worker's anywhere (prefix, head, id, tail, length), without
// building the subject.
func TestIsWorkerIsWorkerSubjectEquality(t *testing.T) {
	for _, prefix := range []string{"", "t1", "t1."} {
		s := NewSubjects(prefix)
		for _, w := range []string{"w1", "", "w1.jobs", "worker"} {
			for _, subj := range []string{s.Worker(w), s.Worker(w + "x"), s.Worker("w2"), "worker." + w + ".jobs",
				"t1.worker." + w + ".jobs", "t2.worker." + w + ".jobs", s.Prefix() + "workex." + w + ".jobs",
				s.Prefix() + "worker." + w + ".jobz", s.Prefix() + "pool." + w + ".jobs", "", s.Worker(w)[1:]} {
				if got, want := s.IsWorker(subj, w), subj == s.Worker(w); got != want {
					t.Errorf("prefix %q: IsWorker(%q, %q) = %v, want %v", prefix, subj, w, got, want)
				}
			}
		}
		subj := s.Worker("w-42")
		if n := testing.AllocsPerRun(100, func() { _ = s.IsWorker(subj, "w-42") }); n != 0 {
			t.Errorf("IsWorker allocates %v, want 0", n)
		}
	}
}
