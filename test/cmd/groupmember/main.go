// Command groupmember is the group member of the end-to-end group tests (test/e2e): the
// process that the tests kill with SIGKILL, stop with SIGSTOP past its TTL, or end with
// SIGTERM (a planned leave) while it owns partitions.
//
// It joins --group as --member with client.JoinGroup and, for every partition it is
// assigned, prints
//
//	ASSIGNED <partition> <epoch>
//
// and then writes to the fenced store at --store every --every while the partition's
// context is live: POST <store>?p=<partition>&m=<member> with the epoch in the
// Fencing-Token header and the call's wall time (Unix ns) in X-Call-Ns. When the
// context ends it prints
//
//	STOPPED <partition> <epoch> <cause>
//
// SIGTERM or SIGINT makes it leave the group (JoinGroup returns) and exit 0, after
// printing LEFT.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/client"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7740", "server address")
	group := flag.String("group", "e2e/group", "group name")
	member := flag.String("member", "m", "member name")
	ttl := flag.Duration("ttl", time.Second, "membership lease TTL")
	store := flag.String("store", "", "URL of the fenced store")
	every := flag.Duration("every", 10*time.Millisecond, "time between two writes of one partition")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := client.Dial(dctx, *addr, client.WithTTL(*ttl))
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "groupmember:", err)
		os.Exit(1)
	}
	hc := &http.Client{Timeout: time.Second}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	err = c.JoinGroup(ctx, *group, *member, func(pctx context.Context, p client.Partition) {
		say("ASSIGNED %d %d", p.Number, p.Epoch)
		url := fmt.Sprintf("%s?p=%d&m=%s", *store, p.Number, *member)
		for pctx.Err() == nil {
			req, err := http.NewRequestWithContext(context.WithoutCancel(pctx), http.MethodPost, url, nil)
			if err != nil {
				fmt.Fprintln(os.Stderr, "groupmember:", err)
				os.Exit(1)
			}
			req.Header.Set("Fencing-Token", strconv.FormatUint(p.Epoch, 10))
			req.Header.Set("X-Call-Ns", strconv.FormatInt(time.Now().UnixNano(), 10))
			if resp, err := hc.Do(req); err == nil {
				_ = resp.Body.Close()
			}
			time.Sleep(*every)
		}
		say("STOPPED %d %d %v", p.Number, p.Epoch, context.Cause(pctx))
	})
	closeCtx, cancel := context.WithTimeout(context.Background(), *ttl)
	_ = c.Close(closeCtx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "groupmember:", err)
		os.Exit(1)
	}
	say("LEFT")
}
