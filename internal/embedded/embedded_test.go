package embedded_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/troupe-run/troupe/internal/embedded"
)

// listen holds a loopback port until the test ends.
func listen(t *testing.T) (net.Listener, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln, ln.Addr().(*net.TCPAddr).Port
}

// A free preferred port is the one chosen.
func TestPortKeepsAFreePreferredPort(t *testing.T) {
	t.Parallel()
	ln, want := listen(t)
	_ = ln.Close() // free again
	got, err := embedded.Port("127.0.0.1", want)
	if err != nil || got != want {
		t.Fatalf("Port(%d) = %d, %v; want the free preferred port", want, got, err)
	}
}

// A taken preferred port falls back to another port that is free.
func TestPortFallsBackWhenThePreferredPortIsTaken(t *testing.T) {
	t.Parallel()
	_, taken := listen(t)
	got, err := embedded.Port("127.0.0.1", taken)
	if err != nil || got == taken || got <= 0 {
		t.Fatalf("Port(%d) = %d, %v; want another port", taken, got, err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(got)))
	if err != nil {
		t.Fatalf("fallback port %d is not free: %v", got, err)
	}
	_ = ln.Close()
}

// The servers start on the address given.
func TestServersStartOnTheAddressGiven(t *testing.T) {
	t.Parallel()
	nl, np := listen(t)
	rl, rp := listen(t)
	_, _ = nl.Close(), rl.Close()
	ns, err := embedded.StartNATSAt(net.JoinHostPort("127.0.0.1", strconv.Itoa(np)))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Stop()
	if want := "nats://127.0.0.1:" + strconv.Itoa(np); ns.URL() != want || ns.Addr() != want[len("nats://"):] {
		t.Fatalf("nats at %s (%s), want %s", ns.URL(), ns.Addr(), want)
	}
	rs, err := embedded.StartRedisAt(net.JoinHostPort("127.0.0.1", strconv.Itoa(rp)))
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	if want := "redis://127.0.0.1:" + strconv.Itoa(rp); rs.URL() != want {
		t.Fatalf("redis at %s, want %s", rs.URL(), want)
	}
	// Port 0 is a free port, as StartNATS and StartRedis use.
	rs0, err := embedded.StartRedisAt("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rs0.Stop()
	ns0, err := embedded.StartNATSAt("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ns0.Stop()
	if ns0.URL() == "nats://127.0.0.1:4222" || ns0.URL() == ns.URL() {
		t.Fatalf("port 0 gave %s", ns0.URL())
	}
}
