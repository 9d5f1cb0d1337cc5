package main

import (
	"github.com/nats-io/nats.go"

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
