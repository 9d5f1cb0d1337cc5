package store

import (
	"fmt"
	"io/fs"
	"path"
	"strings"
	"testing"
)

// The tests here read the Lua files under lua/ and check that every key a
// script hands to redis.call or redis.pcall comes from KEYS: Redis Cluster,
// its proxies and other Redis-protocol servers refuse, or route wrongly, a
// key that a script builds itself from a prefix, from ARGV or from a stored
// value. A key argument passes when it is KEYS[<expression>] or a local
// variable whose every assignment is exactly KEYS[<expression>].

// luaToken is one token of a Lua source.
type luaToken struct {
	kind byte // 'n' name or keyword, 's' string, '0' number, 'o' operator
	text string
	line int
}

// luaTokens splits src into tokens, dropping spaces and comments. It knows
// as much Lua 5.1 as the key check needs: names, numbers, quoted and long
// strings, short and long comments, and operators.
func luaTokens(src string) ([]luaToken, error) {
	var out []luaToken
	line := 1
	// longBracket returns the length of a long bracket's opening at i
	// ("[[" or "[=…=["), and its level; 0 if there is none.
	longBracket := func(i int) (int, int) {
		if i >= len(src) || src[i] != '[' {
			return 0, 0
		}
		j := i + 1
		for j < len(src) && src[j] == '=' {
			j++
		}
		if j < len(src) && src[j] == '[' {
			return j - i + 1, j - i - 1
		}
		return 0, 0
	}
	// skipLong returns the index after the long bracket of level lvl that
	// closes at or after i.
	skipLong := func(i, lvl int) (int, error) {
		closing := "]" + strings.Repeat("=", lvl) + "]"
		j := strings.Index(src[i:], closing)
		if j < 0 {
			return 0, fmt.Errorf("line %d: unclosed long bracket", line)
		}
		line += strings.Count(src[i:i+j], "\n")
		return i + j + len(closing), nil
	}
	ops3 := []string{"..."}
	ops2 := []string{"..", "==", "~=", "<=", ">="}
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '\n':
			line++
			i++
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case strings.HasPrefix(src[i:], "--"):
			if n, lvl := longBracket(i + 2); n > 0 {
				j, err := skipLong(i+2+n, lvl)
				if err != nil {
					return nil, err
				}
				i = j
				continue
			}
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				if j < len(src) && src[j] == '\n' {
					line++
				}
				j++
			}
			if j >= len(src) {
				return nil, fmt.Errorf("line %d: unclosed string", line)
			}
			out = append(out, luaToken{'s', src[i : j+1], line})
			i = j + 1
		case c == '[':
			if n, lvl := longBracket(i); n > 0 {
				start, l := i, line
				j, err := skipLong(i+n, lvl)
				if err != nil {
					return nil, err
				}
				out = append(out, luaToken{'s', src[start:j], l})
				i = j
				continue
			}
			out = append(out, luaToken{'o', "[", line})
			i++
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i
			for j < len(src) && (src[j] == '_' || src[j] >= 'a' && src[j] <= 'z' || src[j] >= 'A' && src[j] <= 'Z' ||
				src[j] >= '0' && src[j] <= '9') {
				j++
			}
			out = append(out, luaToken{'n', src[i:j], line})
			i = j
		case c >= '0' && c <= '9':
			j := i
			for j < len(src) && (src[j] == '.' || src[j] == '_' || src[j] >= '0' && src[j] <= '9' ||
				src[j] >= 'a' && src[j] <= 'z' || src[j] >= 'A' && src[j] <= 'Z' ||
				(src[j] == '-' || src[j] == '+') && (src[j-1] == 'e' || src[j-1] == 'E')) {
				j++
			}
			out = append(out, luaToken{'0', src[i:j], line})
			i = j
		default:
			op := src[i : i+1]
			for _, o := range append(ops3, ops2...) {
				if strings.HasPrefix(src[i:], o) {
					op = o
					break
				}
			}
			out = append(out, luaToken{'o', op, line})
			i += len(op)
		}
	}
	return out, nil
}

// luaKeyArgs says which arguments of a Redis command, after its name, are
// keys: the first (n = 1), all of them (n = -1) or none (n = 0: TIME). A
// command the scripts use must be listed here, so the check knows its keys.
var luaKeyArgs = map[string]int{
	"GET": 1, "SET": 1, "EXPIRE": 1, "PEXPIRE": 1,
	"HGET": 1, "HSET": 1, "HMGET": 1, "HINCRBY": 1, "HGETALL": 1,
	"ZADD": 1, "ZREM": 1, "ZSCORE": 1, "ZCARD": 1, "ZRANGEBYSCORE": 1, "ZREMRANGEBYSCORE": 1,
	"RPUSH": 1, "XADD": 1, "XRANGE": 1, "XREVRANGE": 1, "XTRIM": 1,
	"DEL": -1, "EXISTS": -1,
	"TIME": 0,
}

// continuesExpr holds the tokens that, after "KEYS[...]", would make it
// part of a larger expression.
var continuesExpr = map[string]bool{
	"..": true, "+": true, "-": true, "*": true, "/": true, "%": true, "^": true,
	"==": true, "~=": true, "<": true, ">": true, "<=": true, ">=": true,
	"and": true, "or": true, "[": true, ".": true, ":": true, "(": true, "{": true, ",": true,
}

// keysIndex returns the end (exclusive) of a "KEYS[...]" expression that
// starts at toks[i], or -1 if none starts there.
func keysIndex(toks []luaToken, i int) int {
	if i+1 >= len(toks) || toks[i].text != "KEYS" || toks[i+1].text != "[" {
		return -1
	}
	depth := 0
	for j := i + 1; j < len(toks); j++ {
		switch toks[j].text {
		case "[", "(", "{":
			depth++
		case "]", ")", "}":
			depth--
			if depth == 0 {
				return j + 1
			}
		}
	}
	return -1
}

// keysLocals returns the names in toks that are only ever assigned
// KEYS[...]: at least once, never anything else, and never bound as a
// function parameter, a loop variable or one of several names of one
// assignment.
func keysLocals(toks []luaToken) map[string]bool {
	fromKeys, other := map[string]bool{}, map[string]bool{}
	isName := func(i int) bool { return i >= 0 && i < len(toks) && toks[i].kind == 'n' }
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch {
		case t.text == "local" && isName(i+1) && toks[i+1].text == "function":
			if isName(i + 2) {
				other[toks[i+2].text] = true
			}
		case t.text == "local":
			// local a, b, c [= ...]
			var names []string
			j := i + 1
			for isName(j) {
				names = append(names, toks[j].text)
				if j+1 < len(toks) && toks[j+1].text == "," {
					j += 2
					continue
				}
				j++
				break
			}
			if len(names) == 1 && j < len(toks) && toks[j].text == "=" {
				continue // the assignment case below judges it
			}
			for _, n := range names {
				other[n] = true
			}
		case t.text == "function":
			// function [name](params) or function(params)
			j := i + 1
			for j < len(toks) && toks[j].text != "(" {
				j++
			}
			for j++; j < len(toks) && toks[j].text != ")"; j++ {
				if toks[j].kind == 'n' {
					other[toks[j].text] = true
				}
			}
		case t.text == "for":
			for j := i + 1; j < len(toks) && toks[j].text != "in" && toks[j].text != "=" && toks[j].text != "do"; j++ {
				if toks[j].kind == 'n' {
					other[toks[j].text] = true
				}
			}
		case t.kind == 'n' && i+1 < len(toks) && toks[i+1].text == "=":
			if i > 0 && (toks[i-1].text == "." || toks[i-1].text == ":" || toks[i-1].text == "{") {
				continue // a table field
			}
			if i > 0 && toks[i-1].text == "," {
				// a, b = ...: every target is something else.
				for j := i; j >= 0 && isName(j); j -= 2 {
					other[toks[j].text] = true
					if j == 0 || toks[j-1].text != "," {
						break
					}
				}
				continue
			}
			end := keysIndex(toks, i+2)
			if end < 0 || (end < len(toks) && continuesExpr[toks[end].text]) || (end < len(toks) && toks[end].kind == 's') {
				other[t.text] = true
			} else {
				fromKeys[t.text] = true
			}
		}
	}
	out := map[string]bool{}
	for n := range fromKeys {
		if !other[n] {
			out[n] = true
		}
	}
	return out
}

// luaKeyProblems returns, for one Lua source, every redis.call or
// redis.pcall whose key argument is not taken from KEYS, and every use of
// the redis table or of KEYS that would let a script escape the check.
func luaKeyProblems(src string) ([]string, error) {
	toks, err := luaTokens(src)
	if err != nil {
		return nil, err
	}
	locals := keysLocals(toks)
	var probs []string
	bad := func(t luaToken, format string, a ...interface{}) {
		probs = append(probs, fmt.Sprintf("line %d: ", t.line)+fmt.Sprintf(format, a...))
	}
	for i, t := range toks {
		if t.kind != 'n' {
			continue
		}
		if t.text == "KEYS" {
			if i+1 < len(toks) && toks[i+1].text == "=" {
				bad(t, "KEYS is assigned")
			}
			if end := keysIndex(toks, i); end > 0 && end < len(toks) && toks[end].text == "=" {
				bad(t, "an element of KEYS is assigned")
			}
			continue
		}
		if t.text != "redis" || (i > 0 && toks[i-1].text == ".") {
			continue
		}
		if i+2 >= len(toks) || toks[i+1].text != "." {
			bad(t, "the redis table is used other than through a field")
			continue
		}
		if fn := toks[i+2].text; fn != "call" && fn != "pcall" {
			continue
		}
		if i+3 >= len(toks) || toks[i+3].text != "(" {
			bad(t, "redis.%s is used other than in a direct call", toks[i+2].text)
			continue
		}
		// The call's arguments, split on commas at depth 0.
		var args [][]luaToken
		var cur []luaToken
		depth := 0
		j := i + 4
		for ; j < len(toks); j++ {
			x := toks[j]
			if depth == 0 && x.text == ")" {
				break
			}
			if depth == 0 && x.text == "," {
				args = append(args, cur)
				cur = nil
				continue
			}
			switch x.text {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				depth--
			}
			cur = append(cur, x)
		}
		args = append(args, cur)
		if len(args[0]) != 1 || args[0][0].kind != 's' {
			bad(t, "redis.%s's command is not a string literal", toks[i+2].text)
			continue
		}
		cmd := strings.ToUpper(strings.Trim(args[0][0].text, `'"`))
		n, known := luaKeyArgs[cmd]
		if !known {
			bad(t, "command %s is not in luaKeyArgs: say which of its arguments are keys", cmd)
			continue
		}
		keyArgs := args[1:]
		if n == 0 {
			if len(keyArgs) > 0 {
				bad(t, "%s takes no arguments", cmd)
			}
			continue
		}
		if n > 0 && len(keyArgs) > n {
			keyArgs = keyArgs[:n]
		}
		if len(keyArgs) == 0 {
			bad(t, "%s without a key", cmd)
		}
		for _, a := range keyArgs {
			if len(a) == 1 && a[0].kind == 'n' && locals[a[0].text] {
				continue
			}
			if keysIndex(a, 0) == len(a) {
				continue
			}
			var b strings.Builder
			for k, x := range a {
				if k > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(x.text)
			}
			bad(t, "%s's key %q is not taken from KEYS", cmd, b.String())
		}
	}
	return probs, nil
}

// luaFileNames returns the paths of every embedded Lua file.
func luaFileNames(t *testing.T) []string {
	t.Helper()
	var names []string
	err := fs.WalkDir(luaFiles, "lua", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".lua") {
			names = append(names, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("no Lua files embedded")
	}
	return names
}

// TestLuaScriptsTakeEveryKeyFromKEYS is the static check above over every
// embedded Lua file, scripts and libraries alike.
func TestLuaScriptsTakeEveryKeyFromKEYS(t *testing.T) {
	for _, name := range luaFileNames(t) {
		src, err := luaFiles.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		probs, err := luaKeyProblems(string(src))
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for _, p := range probs {
			t.Errorf("%s: %s", name, p)
		}
	}
}

// TestLuaKeyCheckCatchesBuiltKeys feeds the check the kinds of key a script
// can build for itself (the first ones are lines the scripts had before
// every key went through KEYS), and keys it must accept.
func TestLuaKeyCheckCatchesBuiltKeys(t *testing.T) {
	refused := []string{
		`redis.call('ZADD', tag .. 'due', due, id)`,
		`if redis.call('EXISTS', tag .. 'alive:' .. owner) == 1 then return 1 end`,
		`local k = ARGV[3] .. 'lock:' .. ARGV[i]
redis.call('GET', k)`,
		`redis.call('ZREM', ARGV[4] .. 'idx:SUCCEEDED', ARGV[5])`,
		`local k = tag .. ARGV[b]
redis.call('HSET', k, ARGV[b + 1], ARGV[b + 2])`,
		`redis.call('GET', ARGV[1])`,
		`local k = redis.call('HGET', KEYS[1], 'other')
redis.call('DEL', k)`,
		`local k = KEYS[1]
k = k .. ':x'
redis.call('GET', k)`,
		`local k = KEYS[1] .. ':x'
redis.call('GET', k)`,
		`local a, b = KEYS[1], ARGV[1]
redis.call('GET', b)`,
		`local function f(k) return redis.call('GET', k) end
return f(KEYS[1])`,
		`for _, k in ipairs(KEYS) do redis.call('DEL', k) end`,
		`redis.call('DEL', KEYS[1], ARGV[1])`,
		`local add = {'XADD', KEYS[1], '*', 'f', 'v'}
redis.call(unpack(add))`,
		`local c = redis.call
c('GET', 'x')`,
		`local r = redis
r.call('GET', 'x')`,
		`KEYS[1] = 'x'
redis.call('GET', KEYS[1])`,
		`redis.call('RENAME', KEYS[1], 'x')`,
		`redis.pcall('GET', 'x' .. KEYS[1])`,
		`local t = {k = KEYS[1]}
redis.call('GET', k)`,
	}
	accepted := []string{
		`redis.call('GET', KEYS[1])`,
		`local lock_key = KEYS[3]
-- a comment: redis.call('GET', 'x')
local s = 'redis.call("GET", "x")'
redis.call('SET', lock_key, ARGV[1] .. '|p')`,
		`for i = 1, #KEYS do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[1]) end`,
		`local function w(at, a) redis.call('ZADD', KEYS[at + a], 1, 'm') end`,
		`redis.call('DEL', KEYS[1], KEYS[2])`,
		`redis.call('HSET', KEYS[1], unpack(f))`,
		`redis.pcall('GET', KEYS[#KEYS])`,
	}
	for _, src := range refused {
		probs, err := luaKeyProblems(src)
		if err != nil || len(probs) == 0 {
			t.Errorf("check let through:\n%s\n(err %v)", src, err)
		}
	}
	for _, src := range accepted {
		probs, err := luaKeyProblems(src)
		if err != nil || len(probs) != 0 {
			t.Errorf("check refused:\n%s\n%v (err %v)", src, probs, err)
		}
	}
}

// TestLuaFilesHaveHeadersAndScripts checks that every file starts with the
// comment that names what it does, its KEYS and its ARGV, and that every
// file under lua/ (not lib/) is a script of the package, and the reverse.
func TestLuaFilesHaveHeadersAndScripts(t *testing.T) {
	files := map[string]bool{}
	for _, name := range luaFileNames(t) {
		src, _ := luaFiles.ReadFile(name)
		var header []string
		for _, l := range strings.Split(string(src), "\n") {
			if !strings.HasPrefix(l, "--") {
				break
			}
			header = append(header, l)
		}
		h := strings.Join(header, "\n")
		base := strings.TrimSuffix(path.Base(name), ".lua")
		if dir := path.Dir(name); dir == "lua" {
			files[base] = true
			if !strings.HasPrefix(h, "-- "+base+": ") {
				t.Errorf("%s: the header does not start with %q", name, "-- "+base+": ")
			}
		}
		if !strings.Contains(h, "KEYS") || !strings.Contains(h, "ARGV") {
			t.Errorf("%s: the header does not name its KEYS and ARGV:\n%s", name, h)
		}
	}
	for name := range luaScripts {
		if !files[name] {
			t.Errorf("script %s has no file lua/%s.lua", name, name)
		}
	}
	for name := range files {
		if luaScripts[name] == nil {
			t.Errorf("lua/%s.lua is no script of the package (luaScript(%q) is never called)", name, name)
		}
	}
	for _, sc := range allScripts {
		found := false
		for _, s := range luaScripts {
			found = found || s == sc
		}
		if !found {
			t.Errorf("a script of allScripts is not from lua/")
		}
	}
}
