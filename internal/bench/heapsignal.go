package bench

// HeapDirEnv names a directory: with it set, a child node writes a heap
// profile (after a GC) there on each SIGUSR1, heap-<pid>-<n>.prof — a profile
// at a moment the bench does not choose, such as a release's peak.
const HeapDirEnv = "TROUPE_BENCH_HEAP_DIR"
