package bench

import (
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"
)

func TestLoopbackPortReadsTheFirstLocalAddress(t *testing.T) {
	for in, want := range map[string]int{
		"nats://127.0.0.1:4222":               4222,
		"redis://127.0.0.1:6379/0":            6379,
		"redis://user:pw@localhost:6380":      6380,
		"127.0.0.1:7001,127.0.0.1:7002":       7001,
		"nats://[::1]:4333":                   4333,
		"nats://10.0.0.5:4222":                0, // another host: its CPU is not ours to read
		"nats://127.0.0.1":                    0,
		"redis://127.0.0.1:notaport":          0,
		"nats://127.0.0.1:99999":              0,
		"nats://demo.nats.io:4222,nats://x:1": 0,
	} {
		if got := loopbackPort(in); got != want {
			t.Errorf("loopbackPort(%q) = %d, want %d", in, got, want)
		}
	}
}

// The bench reads the CPU of the nats-server it talks to: the process
// listening on the URL's port, found through /proc.
func TestListenerPIDFindsTheProcessListeningOnThePort(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	if got := listenerPID(url); got != os.Getpid() {
		t.Errorf("listenerPID(%s) = %d, want this process %d", url, got, os.Getpid())
	}
	l.Close()
	if got := listenerPID(url); got != 0 {
		t.Errorf("listenerPID(%s) after close = %d, want 0", url, got)
	}
}
