package store

import (
	"context"
	"embed"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The package's Lua scripts live in lua/, one file per script, named after
// it: lua/activate.lua is activateScript, lua/take_lease.lua is
// takeLeaseScript. lua/lib/ holds functions that several scripts share; a
// script that uses one gets the library's text in front of its own. Each
// file starts with a comment that says what it does, its KEYS and its
// ARGV; the Go side assembles KEYS and ARGV through one call type per
// script (see scriptCall), never by counting positions at the call site.

//go:embed lua/*.lua lua/lib/*.lua
var luaFiles embed.FS

// luaScripts maps every script's name (its file under lua/, without
// ".lua") to the script, for tests that check them all.
var luaScripts = map[string]*redis.Script{}

// luaScript returns the script of lua/<name>.lua, preceded by the shared
// functions lua/lib/<lib>.lua of libs, in order, and records it in
// luaScripts.
func luaScript(name string, libs ...string) *redis.Script {
	var b strings.Builder
	for _, l := range libs {
		b.WriteString(luaSource("lib/" + l))
		b.WriteByte('\n')
	}
	b.WriteString(luaSource(name))
	sc := redis.NewScript(b.String())
	luaScripts[name] = sc
	luaHashes[sc] = sc.Hash()
	return sc
}

// multiScript returns the multi-job variant of lua/<name>.lua with libs
// (see lua/lib/multi.lua). The script's text is the body of a local
// function one(), which multi.lua calls once per job; in it and in its
// libraries, KEYS[i] reads KEYS[mko + i], #KEYS is mkn, ARGV[i] reads
// ma[1 + i], #ARGV is man and unpack(ARGV, i) is unpack(ma, 1 + i): the
// job's keys within the call's, and its arguments as the call's packed
// argument decodes them (ma[1] is its number of keys). It is recorded in
// multiScripts, not luaScripts: it has no file of its own.
func multiScript(name string, libs ...string) *redis.Script {
	shift := strings.NewReplacer("KEYS[", "KEYS[mko + ", "ARGV[", "ma[1 + ", "#ARGV", "man", "#KEYS", "mkn",
		"unpack(ARGV, ", "unpack(ma, 1 + ")
	var b strings.Builder
	b.WriteString("local mko, mkn, man, ma = 0, 0, 0, nil\n")
	for _, l := range libs {
		b.WriteString(shift.Replace(luaSource("lib/" + l)))
		b.WriteByte('\n')
	}
	b.WriteString("local function one()\n")
	b.WriteString(shift.Replace(luaSource(name)))
	b.WriteString("\nend\n")
	b.WriteString(luaSource("lib/multi"))
	sc := redis.NewScript(b.String())
	multiScripts = append(multiScripts, sc)
	luaHashes[sc] = sc.Hash()
	return sc
}

// multiScripts are the scripts multiScript made; LoadScripts loads them
// with allScripts.
var multiScripts []*redis.Script

// luaHashes holds each script's SHA-1 as an interface value, made once, so
// that an EVALSHA's arguments do not box it again on every call.
var luaHashes = map[*redis.Script]interface{}{}

// luaSource returns the text of lua/<path>.lua. The files are embedded, so
// a missing one is a programming error.
func luaSource(path string) string {
	src, err := luaFiles.ReadFile("lua/" + path + ".lua")
	if err != nil {
		panic("store: Lua script " + path + ": " + err.Error())
	}
	return string(src)
}

// scriptCall is one call of a script: the script, and its KEYS and ARGV in
// the order the script's file lists them. Each script has its own type
// (releaseCall, activateCall, ...) whose fields name its inputs.
type scriptCall interface {
	script() *redis.Script
	keys() []string
	args() []interface{}
}

// processor is what evalSha sends through: a client or a pipeline.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// evalSha sends call, or queues it on a pipeline, with EVALSHA. In a
// pipeline, a NOSCRIPT reply is handled by sendScripts. It builds the
// command itself rather than through Script.EvalSha, which boxes every key
// into an interface value (an allocation each): a key goes in as a pointer
// into the call's own key slice, which go-redis writes (and routes, on a
// cluster: the first key names the slot) like the string.
func evalSha(ctx context.Context, c processor, call scriptCall) *redis.Cmd {
	sc := call.script()
	hash, ok := luaHashes[sc]
	if !ok {
		hash = sc.Hash()
	}
	var cmdArgs []interface{}
	nkeys := 0
	if ap, ok := call.(argsAppender); ok {
		nkeys = ap.keyCount()
		cmdArgs = argLists.get(3 + ap.argCount())
		cmdArgs = append(cmdArgs, "evalsha", hash, nkeys)
		cmdArgs = ap.appendArgs(ap.appendKeys(cmdArgs))
	} else {
		keys, args := call.keys(), call.args()
		nkeys = len(keys)
		cmdArgs = make([]interface{}, 0, 3+len(keys)+len(args))
		cmdArgs = append(cmdArgs, "evalsha", hash, nkeys)
		for i := range keys {
			cmdArgs = append(cmdArgs, &keys[i])
		}
		cmdArgs = append(cmdArgs, args...)
	}
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if nkeys > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = c.Process(ctx, cmd)
	return cmd
}

// argsAppender is a scriptCall of the hot path (a *activateCall or
// *transitionCall) that writes its KEYS and ARGV into the EVALSHA's
// argument list itself: keys and most arguments as pointers into the call,
// which go-redis writes like the values, so that sending it allocates the
// list and little else rather than an interface value per argument. Its
// keys() and args() are made from the same appends (keyStrings), so the
// order is written once.
type argsAppender interface {
	keyCount() int
	// argCount is at least the number of keys and arguments appended.
	argCount() int
	appendKeys(dst []interface{}) []interface{}
	appendArgs(dst []interface{}) []interface{}
}

// keyStrings returns appended keys (*string or string) as strings.
func keyStrings(keys []interface{}) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		switch k := k.(type) {
		case *string:
			out[i] = *k
		case string:
			out[i] = k
		}
	}
	return out
}

// runScript sends call with EVALSHA, and with EVAL if Redis answers
// NOSCRIPT (go-redis's Script.Run).
func runScript(ctx context.Context, c redis.Scripter, call scriptCall) *redis.Cmd {
	return call.script().Run(ctx, c, call.keys(), call.args()...)
}

// evalScript sends call, or queues it on a pipeline, with EVAL: the whole
// text, so no NOSCRIPT reply can come back.
func evalScript(ctx context.Context, c redis.Scripter, call scriptCall) *redis.Cmd {
	return call.script().Eval(ctx, c, call.keys(), call.args()...)
}

// argLists recycles the EVALSHA argument lists of the hot scripts. A job's
// two calls take ~40 arguments each, 16 B apiece: over a kilobyte per job,
// a tenth of all a node allocates for it, and what makes it collect
// garbage more often. The writer hands a batch's lists back once it has
// decoded the replies (Writer.exec, recycleArgs); nothing reads a command's
// arguments after that. The list is bounded, so a burst does not keep its
// peak of lists for ever.
var argLists argFreeList

const (
	argListCap    = 64   // the capacity of a new list: any hot call fits
	argListsKept  = 1024 // at most this many idle lists
	argListMaxCap = 256  // a bigger list is not kept
)

type argFreeList struct {
	mu   sync.Mutex
	free [][]interface{}
	// minCap, maxCap and kept, when maxCap is set, replace argListCap,
	// argListMaxCap and argListsKept.
	minCap, maxCap, kept int
}

// bounds returns the list's capacity bounds and how many lists it keeps.
func (f *argFreeList) bounds() (lo, hi, kept int) {
	if f.maxCap > 0 {
		return f.minCap, f.maxCap, f.kept
	}
	return argListCap, argListMaxCap, argListsKept
}

// get returns an empty list with room for n arguments.
func (f *argFreeList) get(n int) []interface{} {
	lo, _, _ := f.bounds()
	f.mu.Lock()
	if k := len(f.free); k > 0 {
		l := f.free[k-1]
		f.free[k-1] = nil
		f.free = f.free[:k-1]
		f.mu.Unlock()
		if cap(l) >= n {
			return l
		}
		return make([]interface{}, 0, max(n, lo))
	}
	f.mu.Unlock()
	return make([]interface{}, 0, max(n, lo))
}

// put keeps l, cleared, for a later get.
func (f *argFreeList) put(l []interface{}) {
	lo, hi, kept := f.bounds()
	if cap(l) < lo || cap(l) > hi {
		return
	}
	clear(l[:cap(l)])
	f.mu.Lock()
	if len(f.free) < kept {
		f.free = append(f.free, l[:0])
	}
	f.mu.Unlock()
}

// multiArgLists recycles the argument lists of the multi-job calls
// (evalShaMulti): up to multiMax jobs' arguments each, a few per flush.
var multiArgLists = argFreeList{minCap: 1024, maxCap: 8192, kept: 32}

// recycleArgs hands back the argument lists of cmds, which their caller
// has done with (replies decoded, errors read): only EVALSHA lists.
func recycleArgs(cmds []redis.Cmder) {
	for _, c := range cmds {
		// A multi-job call's reply commands share multiReplyArgs (go-redis
		// keeps a variadic slice as given): never the pool's to clear.
		if a := c.Args(); len(a) > 0 && a[0] == "evalsha" && &a[0] != &multiReplyArgs[0] {
			argLists.put(a)
		}
	}
}
