package leaky

import (
	rt "github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/store"
)

type Alias = store.Op

type WithField struct {
	F      *store.Job
	hidden store.Op
}

type Embeds struct {
	*store.Store
}

type Iface interface {
	Get() rt.PoolConfig
}

type Leaky struct{}

func (Leaky) Method(x []store.Op) {}

func (Leaky) hidden(x store.Op) {}

type unexported struct{}

func (unexported) Method(x store.Op) {}

func Fn() map[string]rt.PoolConfig {
	f := func(store.Op) {}
	_ = f
	return nil
}

var Var store.Op

var ok = 1

const C = 1
