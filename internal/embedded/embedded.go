// Package embedded starts in-process stand-ins for the services a node needs,
// so `troupe dev`, examples and tests run on a machine with nothing installed:
// a real NATS server with JetStream (nats-server as a library) and miniredis,
// an in-process Redis-protocol server.
//
// miniredis is not Redis: it is single-threaded behind one lock, builds a new
// Lua state per script call, and keeps nothing on disk. It runs Troupe's Lua
// scripts, pipelines and streams correctly, which is what the embedded mode
// needs; it is far too slow for benchmarks (BENCHMARKS.md). Its key
// TTLs do not follow the wall clock by themselves, so StartRedis advances its
// clock once a second to make lock expiry behave as on a real server.
package embedded

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// NATS is an in-process NATS server with JetStream.
type NATS struct {
	srv *server.Server
	dir string
}

// Port returns preferred when host:preferred is free to listen on now, and
// otherwise (or for preferred 0) a free port the system picks. The port is
// free when Port returns; a server started on it moments later normally
// gets it.
func Port(host string, preferred int) (int, error) {
	if preferred > 0 {
		if ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(preferred))); err == nil {
			_ = ln.Close()
			return preferred, nil
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// StartNATS starts a NATS server with JetStream on a free loopback port,
// storing streams in a fresh temporary directory.
func StartNATS() (*NATS, error) { return StartNATSAt("127.0.0.1:0") }

// StartNATSAt is StartNATS listening on addr, host:port (port 0: a free
// port).
func StartNATSAt(addr string) (*NATS, error) {
	host, port, err := splitAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if port == 0 {
		port = server.RANDOM_PORT // to the server, 0 means 4222
	}
	dir, err := os.MkdirTemp("", "troupe-nats-")
	if err != nil {
		return nil, err
	}
	opts := &server.Options{
		Host:      host,
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded nats: not listening on %s after 10s", addr)
	}
	return &NATS{srv: srv, dir: dir}, nil
}

// URL is the server's client URL.
func (n *NATS) URL() string { return n.srv.ClientURL() }

// Addr is the server's host:port.
func (n *NATS) Addr() string { return n.srv.Addr().String() }

// Stop shuts the server down and removes its store.
func (n *NATS) Stop() {
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	_ = os.RemoveAll(n.dir)
}

// Redis is an in-process Redis-protocol server (miniredis).
type Redis struct {
	m    *miniredis.Miniredis
	stop chan struct{}
}

// StartRedis starts miniredis on a free loopback port and keeps its TTL
// clock moving with the wall clock.
func StartRedis() (*Redis, error) { return StartRedisAt("127.0.0.1:0") }

// StartRedisAt is StartRedis listening on addr, host:port (port 0: a free
// port).
func StartRedisAt(addr string) (*Redis, error) {
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr(addr); err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	r := &Redis{m: m, stop: make(chan struct{})}
	go r.tick()
	return r, nil
}

func (r *Redis) tick() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-r.stop:
			return
		case now := <-t.C:
			r.m.FastForward(now.Sub(last))
			last = now
		}
	}
}

// Addr is the server's host:port.
func (r *Redis) Addr() string { return r.m.Addr() }

// URL is a redis:// URL for the server.
func (r *Redis) URL() string { return "redis://" + r.m.Addr() }

// Stop shuts the server down.
func (r *Redis) Stop() {
	close(r.stop)
	r.m.Close()
}

func splitAddr(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", addr)
	}
	return host, port, nil
}
