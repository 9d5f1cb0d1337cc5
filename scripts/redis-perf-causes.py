#!/usr/bin/env python3
"""Shares of a redis-server's CPU samples by cause, from a perf profile taken during a troupe-bench run.

    perf record -F 1999 --call-graph dwarf,8192 -p <redis-server pid> -o r.data   # during the bench
    perf script -i r.data -F time,ip,sym,symoff,dso > r.txt
    scripts/redis-perf-causes.py r.txt [/usr/bin/redis-server]

Only the bench's measured window counts: from the first sample inside an EVALSHA (evalGenericCommand)
to the first sample of the bench's read-back (HGETALL), or the last EVALSHA sample when there is none.

Two tables: by cause (what a sample's stack shows: a command run by redis.call, redis.call's own
dispatch and conversions, cmsgpack, Lua running the script, work outside scripts), and by the function
a sample was in. The Debian redis-server exports Redis's functions and Lua's lua_* API but not Lua's
internals; those are told apart by address range. LUA_PARTS holds the ranges of Debian's
redis-server 7.0.15 (found from its exported neighbours and by disassembling the hottest loops:
lstring's string hash, lgc's sweep); another build needs its own.
"""
import bisect
import collections
import re
import subprocess
import sys

LUA_PARTS = [  # (start, end, what): file offsets in Debian's redis-server 7.0.15
    (0x1524E0, 0x156000, 'lapi (C API)'),
    (0x156000, 0x158C00, 'ldo, ldebug, lfunc (calls, closures)'),
    (0x158C00, 0x15A800, 'lgc (garbage collection)'),
    (0x15A800, 0x15E500, 'llex .. lstate'),
    (0x15E500, 0x15EA00, 'lstring (string hashing, interning)'),
    (0x15EA00, 0x160800, 'ltable, ltm (tables)'),
    (0x160800, 0x162E00, 'lvm (bytecode)'),
    (0x162E00, 0x16C700, 'Lua libraries'),
    (0x16D6D0, 0x16FB70, 'cmsgpack'),
]
COMMANDS = {
    'zaddGenericCommand': 'ZADD', 'hsetCommand': 'HSET', 'delGenericCommand': 'DEL', 'getCommand': 'GET',
    'existsCommand': 'EXISTS', 'hmgetCommand': 'HMGET', 'zremCommand': 'ZREM', 'setCommand': 'SET',
    'setGenericCommand': 'SET', 'hincrbyCommand': 'HINCRBY', 'genericHgetallCommand': 'HGETALL',
    'hgetCommand': 'HGET', 'zcardCommand': 'ZCARD', 'timeCommand': 'TIME', 'pexpireCommand': 'PEXPIRE',
    'zrangeGenericCommand': 'ZRANGE*', 'zscanCommand': 'ZSCAN', 'scanGenericCommand': 'SCAN',
}


def exported_symbols(binary):
    out = subprocess.run(['nm', '-D', '--defined-only', binary], capture_output=True, text=True, check=True).stdout
    syms = sorted((int(a, 16), n) for a, _, n in (l.split() for l in out.splitlines() if len(l.split()) == 3))
    return [a for a, _ in syms], [n for _, n in syms]


def lua_part(off):
    for a, b, what in LUA_PARTS:
        if a <= off < b:
            return what
    return None


def read_samples(path, addrs, names):
    """Yields (time, [(symbol, dso, offset)], leaf first) per sample."""
    cur = None
    for line in open(path):
        m = re.match(r'\s*([0-9]+\.[0-9]+):', line)
        if m:
            if cur:
                yield cur
            cur = (float(m.group(1)), [])
            continue
        parts = line.strip().split(None, 1)
        if cur is None or len(parts) < 2:
            continue
        ip, rest = parts
        m = re.match(r'(.*?)(?:\+0x[0-9a-f]+)? \((.*)\)$', rest)
        sym, dso = (m.group(1), m.group(2)) if m else (rest, '')
        off = int(ip, 16)
        if sym == '[unknown]' and 'redis' in dso:
            part = lua_part(off)
            if part:
                sym = 'LUA:' + part
            else:
                i = bisect.bisect_right(addrs, off) - 1
                sym = 'near:' + (names[i] if i >= 0 else '?')
        cur[1].append((sym, dso, off))
    if cur:
        yield cur


def cause(stack):
    names = [s for s, _, _ in stack]
    if 'evalGenericCommand' in names:
        if 'scriptCall' in names:
            for s in names[:names.index('scriptCall')]:
                if s in COMMANDS:
                    return 'script: redis.call ' + COMMANDS[s]
            return 'script: redis.call dispatch (command look-up, clock, latency histograms)'
        if any(s.startswith('mp_') or s == 'LUA:cmsgpack' for s in names):
            if any('unpack' in s or s == 'mp_decode_to_lua_array' for s in names):
                return 'script: cmsgpack.unpack'
            return 'script: cmsgpack.pack'
        if any(s.startswith(('near:luaRed', 'near:luaArg', 'near:freeLuaRedisArgv')) or s == 'freeLuaRedisArgv'
               for s in names):
            return "script: redis.call's argument and reply conversion"
        if names[0].startswith(('LUA:', 'lua')):
            return 'script: Lua running the script'
        return 'script: libc, kernel or unresolved, called from Lua'
    for s in names:
        if s in COMMANDS:
            return 'outside scripts: ' + COMMANDS[s]
    return 'outside scripts: requests, replies, event loop'


def self_class(sym, dso):
    if 'kernel' in dso:
        return 'kernel'
    if sym.startswith('LUA:'):
        return 'Lua: ' + sym[4:]
    if sym.startswith(('lua_', 'luaL_', 'mp_')):
        return 'Lua: lapi (C API)'
    if 'jemalloc' in dso or sym in ('malloc', 'free', 'realloc', 'calloc', 'malloc_usable_size', 'zmalloc', 'zfree',
                                    'zrealloc', 'zmalloc_usable', 'ztrymalloc_usable', 'sdsfree', '_sdsnewlen'):
        return 'allocation and freeing'
    if re.search(r'printf|strtod|str_to_mpn|hack_digit|mpn_|fpconv|string2d|ld2string|d2string', sym):
        return 'number formatting and parsing'
    if sym.startswith('dict') or sym in ('siphash', '_dictClear'):
        return 'hash tables (dict)'
    if sym.startswith(('lp', 'zsl', 'zzl')):
        return 'listpack, skiplist'
    if 'libc' in dso:
        return 'libc, other'
    return 'Redis, other'


def main():
    path = sys.argv[1]
    binary = sys.argv[2] if len(sys.argv) > 2 else '/usr/bin/redis-server'
    addrs, names = exported_symbols(binary)
    samples = list(read_samples(path, addrs, names))
    evals = [t for t, st in samples if any(s == 'evalGenericCommand' for s, _, _ in st)]
    if not evals:
        sys.exit('no sample inside an EVALSHA')
    readback = [t for t, st in samples if any(s == 'genericHgetallCommand' for s, _, _ in st)]
    t0, t1 = min(evals), (min(readback) if readback else max(evals))
    win = [st for t, st in samples if t0 <= t <= t1]
    n = len(win)
    print(f'{len(samples)} samples, {n} in the window ({t1 - t0:.2f} s)')
    for title, key in (('by cause (stack)', cause), ('by the function a sample was in', lambda st: self_class(*st[0][:2]))):
        print(f'\n{title}:')
        for k, v in collections.Counter(key(st) for st in win).most_common():
            print(f'{100 * v / n:6.1f} %  {k}')


if __name__ == '__main__':
    main()
