package main

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/connect"
)

// Every command that dials NATS or Redis goes through these, so each takes
// the same --nats-*/--redis-* flags, TROUPE_* variables and --conn-config
// file (internal/connect), and none prints a secret.

// conns resolves the connection flags (after fs.Parse) and logs what an
// operator should know about them (plaintext secrets, unverified TLS).
func (c *common) conns() (connect.Settings, error) {
	s, err := c.conn.Resolve()
	if err != nil {
		return connect.Settings{}, err
	}
	log := c.logger()
	if s.NATSURL != "" {
		for _, w := range s.NATS.Warnings(s.NATSURL) {
			log.Warn(w)
		}
	}
	if s.RedisURL != "" {
		for _, w := range s.Redis.Warnings(s.RedisURL) {
			log.Warn(w)
		}
	}
	return s, nil
}

// dialNATS connects to NATS as the client called name.
func (c *common) dialNATS(name string, opts ...nats.Option) (*nats.Conn, error) {
	s, err := c.conns()
	if err != nil {
		return nil, err
	}
	return connect.DialNATS(s.NATSURL, s.NATS, append([]nats.Option{nats.Name(name)}, opts...)...)
}

// dialRedis connects to Redis with the flags' settings, as a command that
// dialed Redis would (a cluster when several addresses are given).
func (c *common) dialRedis(ctx context.Context) (redis.UniversalClient, error) {
	s, err := c.conns()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return connect.DialRedis(ctx, s.RedisURL, s.Redis)
}
