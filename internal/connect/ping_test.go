package connect_test

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe/internal/connect"
)

// freezer relays one TCP connection to a server until frozen; then it
// passes nothing either way but keeps the sockets open, as a server
// process stopped with SIGSTOP does.
type freezer struct {
	ln     net.Listener
	frozen chan struct{}
}

func newFreezer(t *testing.T, upstream string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, frozen: make(chan struct{})}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			t.Cleanup(func() { _ = c.Close(); _ = up.Close() })
			go f.relay(up, c)
			go f.relay(c, up)
		}
	}()
	return f
}

func (f *freezer) relay(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-f.frozen:
			return // swallow it all, answer nothing
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) freeze() { close(f.frozen) }

// TestDialNATSNoticesAFrozenServerInSeconds: a connection made by
// DialNATS pings its server every NATSPingInterval, so a server that stops
// answering (but keeps its socket open) is taken as gone after
// NATSMaxPingsOut unanswered pings — seconds, where nats.go's defaults
// take up to 4 minutes, during which a node would hold every worker's
// silence against the worker (issue 29, item 4).
func TestDialNATSNoticesAFrozenServerInSeconds(t *testing.T) {
	t.Parallel()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	f := newFreezer(t, ns.Addr().String())
	down := make(chan error, 1)
	nc, err := connect.DialNATS("nats://"+f.ln.Addr().String(), connect.NATS{}, nats.NoReconnect(),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			select {
			case down <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	f.freeze()
	// A bound that only the old defaults (2 min × 2) would miss.
	limit := connect.NATSPingInterval*(connect.NATSMaxPingsOut+1) + 10*time.Second
	select {
	case <-down:
	case <-time.After(limit):
		t.Fatalf("connection still up %v after the server froze", limit)
	}
}
