// Package capsnippets holds the stock CAP worker snippets of README's
// "Heartbeat snippets" as files (go/, python/, node/) and the test that
// keeps the two the same. scripts/check-cap-snippets.sh builds and runs
// them against a CAP SDK checkout; go/ is a module of its own, so the
// node's build never needs the SDK.
package capsnippets
