package verify

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/fence"
)

// IsWriter reports whether this process was started by Run as one of its writers: a
// program that calls Run with a WriterCommand of its own (a test binary, say) checks it
// first thing and then calls WriterMain.
func IsWriter() bool { return os.Getenv(writerEnv) != "" }

// WriterMain runs this process as one of Run's writers, until SIGTERM, and returns the
// exit code. The leasehold CLI calls it for `leasehold verify-writer`.
func WriterMain() int {
	var cfg writerConfig
	if err := json.Unmarshal([]byte(os.Getenv(writerEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "verify writer: %s: %v\n", writerEnv, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	w := &writer{cfg: cfg, http: &http.Client{Timeout: 10 * cfg.TTL}, out: json.NewEncoder(os.Stdout)}
	if cfg.DSN != "" {
		t, err := newSQLTarget(ctx, cfg)
		if err != nil {
			w.emit(event{Ev: "fatal", Detail: err.Error()})
			return 1
		}
		defer func() { _ = t.db.Close() }()
		w.sql = t
	}
	if err := w.run(ctx); err != nil {
		w.emit(event{Ev: "fatal", Detail: err.Error()})
		return 1
	}
	return 0
}

type writer struct {
	cfg  writerConfig
	http *http.Client
	sql  *sqlTarget // the SQL target; nil: HTTP
	mu   sync.Mutex // guards out
	out  *json.Encoder
}

func (w *writer) emit(e event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.out.Encode(e)
}

// run takes the lock in turn with the other writers and writes while holding it, until
// ctx ends.
func (w *writer) run(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := client.Dial(dctx, w.cfg.Addr, client.WithTTL(w.cfg.TTL))
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.Close(cctx)
	}()
	for ctx.Err() == nil {
		l, err := c.Lock(ctx, w.cfg.Lock, client.Correctness, client.LockTTL(w.cfg.TTL), client.WithNote(fmt.Sprintf("verify writer %d", w.cfg.ID)))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("lock %q: %w", w.cfg.Lock, err)
		}
		w.emit(event{Ev: "grant", Token: l.Token(), Call: time.Now().UnixNano()})
		// The writes go out whatever l.Context() says: a paused process that resumes
		// does not know it was paused until it looks, and the pause may come between the
		// look and the write. That stale write is what the resource must refuse.
		for seq := range w.cfg.WritesPerTenure {
			if ctx.Err() != nil {
				break
			}
			w.write(ctx, l.Token(), seq)
			time.Sleep(w.cfg.Spacing)
		}
		rerr := l.Unlock(context.WithoutCancel(ctx))
		e := event{Ev: "release", Token: l.Token()}
		if rerr != nil {
			e.Detail = rerr.Error()
		}
		w.emit(e)
	}
	return nil
}

// write sends one fenced write and records it.
func (w *writer) write(ctx context.Context, token uint64, seq int) {
	if w.sql != nil {
		w.writeSQL(ctx, token, seq)
		return
	}
	body, _ := json.Marshal(map[string]any{"writer": w.cfg.ID, "seq": seq, "token": token})
	e := event{Ev: "write", Token: token, Seq: seq}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.URL, bytes.NewReader(body))
	if err != nil {
		e.Out, e.Detail = Unknown, err.Error()
		w.emit(e)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(fence.HeaderName, fence.FormatHeader(w.cfg.Lock, token))
	e.Call = time.Now().UnixNano()
	resp, err := w.http.Do(req)
	if err != nil {
		e.Out, e.Detail = Unknown, err.Error()
		w.emit(e)
		return
	}
	_ = resp.Body.Close()
	e.Ret = time.Now().UnixNano()
	switch {
	case slices.Contains(w.cfg.Accepted, resp.StatusCode):
		e.Out = Accepted
	case slices.Contains(w.cfg.Rejected, resp.StatusCode):
		e.Out, e.Detail = Rejected, "HTTP "+strconv.Itoa(resp.StatusCode)
	default:
		e.Out, e.Detail = Unknown, "HTTP "+strconv.Itoa(resp.StatusCode)
	}
	w.emit(e)
}
