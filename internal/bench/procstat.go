package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// userHZ is the unit of utime/stime in /proc/<pid>/stat. Linux fixes
// USER_HZ at 100 for user space whatever the kernel's HZ, so a tick is 10 ms.
const userHZ = 100

// procCPU returns pid's user+system CPU time from /proc/<pid>/stat (10 ms
// resolution).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after ')' are fixed.
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, fmt.Errorf("bench: /proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[end+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: /proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bench: /proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(ut+st) * time.Second / userHZ, nil
}

// procPeakRSS returns pid's peak resident set (VmHWM) in bytes.
func procPeakRSS(pid int) (int64, error) { return procStatusKB(pid, "VmHWM:") }

// procRSS returns pid's resident set now (VmRSS) in bytes.
func procRSS(pid int) (int64, error) { return procStatusKB(pid, "VmRSS:") }

// procStatusKB reads one "Name:  N kB" line of /proc/<pid>/status, in bytes.
func procStatusKB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, err
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("bench: /proc/%d/status: no %s", pid, field)
}

// selfCPU is this process's user+system CPU time (getrusage, µs resolution).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// findProcess returns the pid of the only process whose command name is comm,
// or 0 when there is none or more than one (then its CPU is not reported:
// guessing would attribute another server's CPU to this run).
func findProcess(comm string) int {
	matches, _ := filepath.Glob("/proc/[0-9]*/comm")
	found := 0
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil || strings.TrimSpace(string(b)) != comm {
			continue
		}
		if found != 0 {
			return 0
		}
		found, _ = strconv.Atoi(filepath.Base(filepath.Dir(m)))
	}
	return found
}

// Machine describes the host the way BENCHMARKS.md records it.
type Machine struct {
	CPUModel string `json:"cpu_model"`
	CPUs     int    `json:"cpus"`
	MemBytes int64  `json:"mem_bytes"`
	Kernel   string `json:"kernel,omitempty"`
	Go       string `json:"go"`
}

func (m Machine) String() string {
	return fmt.Sprintf("%s, %d CPUs, %.1f GiB", m.CPUModel, m.CPUs, float64(m.MemBytes)/(1<<30))
}

func describeMachine() Machine {
	m := Machine{CPUModel: "unknown CPU", CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				m.MemBytes = kb * 1024
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// loadAverage returns the 1, 5 and 15 minute load averages ("" where
// /proc/loadavg cannot be read).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// gitDescribe names the checked-out code, or "" outside a git work tree.
// It only reads the repository.
func gitDescribe() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty", "--tags").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// listenerPID returns the pid of the local process listening on the TCP
// port of rawURL (a NATS or Redis URL; the first of several, comma-separated),
// or 0 when the host is not this machine's loopback or no process of this
// user is found. It reads the listening socket's inode from /proc/net/tcp
// and tcp6, then the process holding it from /proc/<pid>/fd. With several
// nats-servers on one host (the system's and a private one), the bench
// reads the one it talks to, not whichever findProcess finds.
func listenerPID(rawURL string) int {
	port := loopbackPort(rawURL)
	if port == 0 {
		return 0
	}
	inode := listeningInode(port)
	if inode == "" {
		return 0
	}
	want := "socket:[" + inode + "]"
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && l == want {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(fd))))
			return pid
		}
	}
	return 0
}

// loopbackPort is the port of rawURL's first address when its host is a
// loopback name or address; 0 otherwise.
func loopbackPort(rawURL string) int {
	first, _, _ := strings.Cut(rawURL, ",")
	if _, rest, ok := strings.Cut(first, "://"); ok {
		first = rest
	}
	if _, rest, ok := strings.Cut(first, "@"); ok {
		first = rest
	}
	first, _, _ = strings.Cut(first, "/")
	host, port, ok := strings.Cut(first, ":")
	if strings.HasPrefix(first, "[") { // [::1]:4222
		h, p, ok2 := strings.Cut(strings.TrimPrefix(first, "["), "]:")
		host, port, ok = h, p, ok2
	}
	if !ok || (host != "127.0.0.1" && host != "localhost" && host != "::1") {
		return 0
	}
	n, err := strconv.Atoi(port)
	if err != nil || n <= 0 || n > 65535 {
		return 0
	}
	return n
}

// listeningInode is the inode of a socket listening on port (any local
// address), from /proc/net/tcp and tcp6; "" when none.
func listeningInode(port int) string {
	hexPort := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			fs := strings.Fields(line)
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			if len(fs) < 10 || fs[3] != "0A" || !strings.HasSuffix(fs[1], hexPort) {
				continue
			}
			return fs[9]
		}
	}
	return ""
}
