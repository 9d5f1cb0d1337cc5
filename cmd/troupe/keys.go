package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/troupe-run/troupe/signing"
)

// runKeys handles `troupe keys gen`: a P-256 key pair for one sender, and
// the key set line that trusts it.
func runKeys(_ context.Context, args []string) error {
	const usage = "usage: troupe keys gen --out DIR --sender NAME [--role node|worker|client|operator [--pools P,...] [--tenants T,...]]"
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprintln(os.Stderr, usage)
		return flag.ErrHelp
	}
	if len(args) == 0 || args[0] != "gen" {
		return errors.New(usage)
	}
	fs := newFlags("keys gen")
	out := fs.String("out", ".", "directory to write <sender>.key (private, mode 0600) and <sender>.pub into")
	sender := fs.String("sender", "", "the sender id the key signs as (a node id, worker id, troupe-cli, ...)")
	role := fs.String("role", "", "the sender's role in the printed key set entry: node, worker, client or operator (empty: an entry of keys alone, which may act as every role)")
	pools := fs.String("pools", "", "with --role worker: the pools it serves, comma-separated (* for any)")
	tenants := fs.String("tenants", "", "with --role client: the tenants it submits for, comma-separated (* for any)")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if *sender == "" {
		return errors.New("--sender is required")
	}
	priv, pub, err := signing.GenerateKey()
	if err != nil {
		return err
	}
	line, err := keySetEntry(*sender, *role, *pools, *tenants, pub)
	if err != nil {
		return err
	}
	base := filepath.Join(*out, strings.ReplaceAll(*sender, "/", "_"))
	if err := writeNew(base+".key", priv, 0o600); err != nil {
		return err
	}
	if err := writeNew(base+".pub", pub, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s.key and %s.pub; add this line to the key set of whoever verifies %s:\n", base, base, *sender)
	fmt.Print(line)
	return nil
}

// writeNew writes a file that must not exist yet (never overwrite a key).
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("keys: %w", err)
	}
	return f.Close()
}

// keySetEntry is the key set line that lists pub for sender: keys alone
// without a role, else a mapping with the role and its scope (pools and
// tenants comma-separated). The line must load as a key set, so a bad role
// or a missing scope is said before any key file is written.
func keySetEntry(sender, role, pools, tenants string, pub []byte) (string, error) {
	line := fmt.Sprintf("%s: [%s]\n", strconv.Quote(sender), strconv.Quote(string(pub)))
	if role != "" {
		var b strings.Builder
		fmt.Fprintf(&b, "%s: {role: %s", strconv.Quote(sender), strconv.Quote(role))
		for _, l := range []struct{ key, val string }{{"pools", pools}, {"tenants", tenants}} {
			if l.val == "" {
				continue
			}
			var q []string
			for _, v := range strings.Split(l.val, ",") {
				q = append(q, strconv.Quote(strings.TrimSpace(v)))
			}
			fmt.Fprintf(&b, ", %s: [%s]", l.key, strings.Join(q, ", "))
		}
		fmt.Fprintf(&b, ", keys: [%s]}\n", strconv.Quote(string(pub)))
		line = b.String()
	}
	if _, err := signing.ParseKeySet([]byte(line)); err != nil {
		return "", fmt.Errorf("keys gen: %w", err)
	}
	return line, nil
}
