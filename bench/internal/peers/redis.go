package peers

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/internal/proc"
)

// redisSys is a single redis-server, either purely in memory or with an append-only
// file fsynced on every write (the only Redis mode in which an acknowledged lock
// survives a crash of the machine).
type redisSys struct {
	o       Options
	aof     bool
	p       *proc.Process
	rdb     *redis.Client
	version string
}

func newRedis(o Options, aof bool) *redisSys { return &redisSys{o: o, aof: aof} }

func (r *redisSys) Name() string {
	if r.aof {
		return "redis-aof"
	}
	return "redis-mem"
}

func (r *redisSys) Describe() string {
	mode := "in memory (`--save '' --appendonly no`)"
	if r.aof {
		mode = "`--appendonly yes --appendfsync always` (fsync before every reply)"
	}
	return fmt.Sprintf("one redis-server, %s; recipe `SET key token NX PX %d` + compare-and-delete Lua script (go-redis v9, one shared client pool), retry after %v ±50%% while taken",
		mode, r.o.TTL.Milliseconds(), r.o.RedisRetry)
}

func (r *redisSys) Start(ctx context.Context, dir string) error {
	bin, err := lookPath("redis-server", "redis-server")
	if err != nil {
		return err
	}
	ports, err := proc.FreePorts(1)
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	args := []string{bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(ports[0]),
		"--dir", dir, "--daemonize", "no", "--save", "", "--protected-mode", "yes",
		"--maxclients", "10000", "--loglevel", "warning",
	}
	if r.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	r.p, err = proc.Start(proc.Options{Name: r.Name(), Log: filepath.Join(dir, "redis.log"), Argv: args, Group: true})
	if err != nil {
		return err
	}
	if err := r.p.WaitTCP(ctx, addr); err != nil {
		return err
	}
	r.rdb = redis.NewClient(&redis.Options{Addr: addr, PoolSize: 256, MinIdleConns: 64, DialTimeout: 3 * time.Second})
	info, err := r.rdb.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("redis: INFO: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			r.version = v
		}
	}
	if deb := debVersion("redis-server"); deb != "" {
		r.version += " (Debian " + deb + ")"
	}
	return nil
}

func (r *redisSys) Version() string { return r.version }
func (r *redisSys) PIDs() []int     { return []int{r.p.PID()} }

func (r *redisSys) Stop() {
	if r.rdb != nil {
		_ = r.rdb.Close()
	}
	if r.p != nil {
		_ = r.p.Stop(10 * time.Second)
	}
}

// redisUnlock deletes the key only if it still holds our token: without the compare, a
// holder whose key expired would delete the next holder's lock.
var redisUnlock = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

// errRedisNotHolder is returned by a release that found another token (or none).
var errRedisNotHolder = errors.New("redis: lock no longer held by this token")

type redisWorker struct {
	r *redisSys
}

func (r *redisSys) NewWorker(ctx context.Context) (Worker, error) { return redisWorker{r}, nil }

func (w redisWorker) Acquire(ctx context.Context, name string) (Held, error) {
	key := "lock:" + name
	var b [16]byte
	_, _ = crand.Read(b[:])
	token := hex.EncodeToString(b[:])
	ttl := w.r.o.TTL.Milliseconds()
	for {
		err := w.r.rdb.Do(ctx, "SET", key, token, "NX", "PX", ttl).Err()
		if err == nil {
			return heldFunc(func(ctx context.Context) error {
				n, err := redisUnlock.Run(ctx, w.r.rdb, []string{key}, token).Int()
				if err != nil {
					return err
				}
				if n != 1 {
					return errRedisNotHolder
				}
				return nil
			}), nil
		}
		if !errors.Is(err, redis.Nil) {
			return nil, err
		}
		d := w.r.o.RedisRetry
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(d/2 + time.Duration(rand.Int64N(int64(d)+1))):
		}
	}
}

func (w redisWorker) Close(context.Context) error { return nil }
