// The Go snippet's own module, so the node's build skips it;
// scripts/check-cap-snippets.sh builds it against a CAP SDK checkout.
module example.com/cap-echo-worker

go 1.23
