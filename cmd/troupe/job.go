package main

import "context"

// The operator commands are the admin API's client (admin_cli.go) under
// shorter names: `troupe job …` is `troupe ctl job …`, and so on.

func runJob(ctx context.Context, args []string) error {
	return stdCtl().run(ctx, append([]string{"job"}, args...))
}

func runDLQ(ctx context.Context, args []string) error {
	return stdCtl().run(ctx, append([]string{"dlq"}, args...))
}

func runPool(ctx context.Context, args []string) error {
	return stdCtl().run(ctx, append([]string{"pool"}, args...))
}

func runSaga(ctx context.Context, args []string) error {
	return stdCtl().run(ctx, append([]string{"saga"}, args...))
}
