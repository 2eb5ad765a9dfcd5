package peers

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/leasehold/leasehold/internal/proc"
)

// redisSys is a single redis-server, either purely in memory or with an append-only
// file fsynced on every write (the only Redis mode in which an acknowledged lock
// survives a crash of the machine), driven through one of two Go clients:
//
//   - go-redis v9 (redis-mem, redis-aof): a pool of connections; each command has a
//     connection to itself for its round trip, so 64 workers use 64 connections, as a
//     client per worker would.
//   - rueidis (redis-mem-rueidis, redis-aof-rueidis): one client shared by every worker
//     that pipelines the commands issued concurrently on a few connections (its default,
//     PipelineMultiplex 2: four), as leasehold's shared client multiplexes its Sessions'
//     requests on one connection.
type redisSys struct {
	o       Options
	aof     bool
	rueidis bool
	p       *proc.Process
	rdb     *redis.Client  // go-redis
	rc      rueidis.Client // rueidis
	version string
}

func newRedis(o Options, aof, pipelined bool) *redisSys {
	return &redisSys{o: o, aof: aof, rueidis: pipelined}
}

func (r *redisSys) Name() string {
	name := "redis-mem"
	if r.aof {
		name = "redis-aof"
	}
	if r.rueidis {
		name += "-rueidis"
	}
	return name
}

// SharedClient is true for the rueidis recipe: every worker's commands go through one
// pipelining client.
func (r *redisSys) SharedClient() bool { return r.rueidis }

func (r *redisSys) Describe() string {
	mode := "in memory (`--save '' --appendonly no`)"
	if r.aof {
		mode = "`--appendonly yes --appendfsync always` (fsync before every reply)"
	}
	client := "go-redis v9, one pool: a connection per command in flight, so one per worker"
	if r.rueidis {
		client = "rueidis, one client shared by every worker, auto-pipelining concurrent commands on its default 4 connections"
	}
	return fmt.Sprintf("one redis-server, %s; recipe `SET key token NX PX %d` + compare-and-delete Lua script (%s), retry after %v ±50%% while taken",
		mode, r.o.TTL.Milliseconds(), client, r.o.RedisRetry)
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
	var info string
	if r.rueidis {
		r.rc, err = rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, Dialer: net.Dialer{Timeout: 3 * time.Second}})
		if err != nil {
			return fmt.Errorf("redis: rueidis: %w", err)
		}
		info, err = r.rc.Do(ctx, r.rc.B().Info().Section("server").Build()).ToString()
	} else {
		r.rdb = redis.NewClient(&redis.Options{Addr: addr, PoolSize: 256, MinIdleConns: 64, DialTimeout: 3 * time.Second})
		info, err = r.rdb.Info(ctx, "server").Result()
	}
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
	if r.rc != nil {
		r.rc.Close()
	}
	if r.p != nil {
		_ = r.p.Stop(10 * time.Second)
	}
}

// redisUnlockScript deletes the key only if it still holds our token: without the
// compare, a holder whose key expired would delete the next holder's lock. Both clients
// send it by its SHA (EVALSHA), and the script itself once when Redis does not know it.
const redisUnlockScript = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`

var (
	redisUnlock   = redis.NewScript(redisUnlockScript)
	rueidisUnlock = rueidis.NewLuaScript(redisUnlockScript)
)

// setNX runs SET key token NX PX ttl: whether it set the key.
func (r *redisSys) setNX(ctx context.Context, key, token string, ttl int64) (bool, error) {
	var err error
	if r.rueidis {
		err = r.rc.Do(ctx, r.rc.B().Set().Key(key).Value(token).Nx().PxMilliseconds(ttl).Build()).Error()
		if rueidis.IsRedisNil(err) {
			return false, nil
		}
	} else {
		err = r.rdb.Do(ctx, "SET", key, token, "NX", "PX", ttl).Err()
		if errors.Is(err, redis.Nil) {
			return false, nil
		}
	}
	return err == nil, err
}

// unlock runs the compare-and-delete script: how many keys it deleted.
func (r *redisSys) unlock(ctx context.Context, key, token string) (int64, error) {
	if r.rueidis {
		return rueidisUnlock.Exec(ctx, r.rc, []string{key}, []string{token}).AsInt64()
	}
	return redisUnlock.Run(ctx, r.rdb, []string{key}, token).Int64()
}

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
		ok, err := w.r.setNX(ctx, key, token, ttl)
		if err != nil {
			return nil, err
		}
		if ok {
			return heldFunc(func(ctx context.Context) error {
				n, err := w.r.unlock(ctx, key, token)
				if err != nil {
					return err
				}
				if n != 1 {
					return errRedisNotHolder
				}
				return nil
			}), nil
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
