package leader

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/core"
)

type outcome struct {
	token uint64
	err   error
}

// await waits for a queued acquire's grant, the end of its wait, or ctx.
func (l *Leader) await(ctx context.Context, a AcquireArgs, ch chan outcome, queued core.Result) (Grant, error) {
	defer l.unregister(a.Lease, a.Name, ch)
	g := Grant{Class: a.Class}
	if a.Class == core.Efficiency {
		g.Epoch = l.Epoch()
	}
	var timeout <-chan time.Time
	if !a.Forever {
		t := time.NewTimer(a.WaitFor)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case o := <-ch:
		g.Token = o.token
		return g, o.err
	case <-timeout:
		tok, err := l.cancelWait(context.WithoutCancel(ctx), a, ch)
		if err != nil || tok != 0 {
			g.Token = tok
			return g, err
		}
		return g, &LockHeldError{Name: a.Name, HolderToken: queued.HolderToken, Holder: queued.Holder, Waited: true}
	case <-ctx.Done():
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		// The caller is gone: leave the queue, and give back a grant that raced us.
		if tok, err := l.cancelWait(cctx, a, ch); err == nil && tok != 0 {
			_ = l.Release(cctx, a.Lease, a.Name, tok)
		}
		return g, ctx.Err()
	}
}

// cancelWait takes the lease out of the queue. It returns the token when the grant won
// the race.
func (l *Leader) cancelWait(ctx context.Context, a AcquireArgs, ch chan outcome) (uint64, error) {
	var res core.Result
	if a.Class == core.Efficiency {
		l.mu.Lock()
		if !l.active {
			l.mu.Unlock()
			return 0, ErrNotLeader
		}
		res = l.eff.CancelWait(a.Lease, a.Name)
		l.mu.Unlock()
	} else {
		var err error
		res, err = l.log.Apply(ctx, core.Command{Op: core.OpCancelWait, Lease: a.Lease, Name: a.Name})
		if err != nil {
			return 0, err
		}
	}
	if res.Err != nil {
		select {
		case o := <-ch: // the outcome arrived meanwhile
			return o.token, o.err
		default:
		}
		if errors.Is(res.Err, core.ErrLeaseNotFound) {
			return 0, l.gone(a.Lease)
		}
		return 0, nil // not waiting any more: report the timeout
	}
	return res.Token, nil
}

func (l *Leader) registerLocked(lease core.LeaseID, name string) chan outcome {
	ch := make(chan outcome, 1)
	m := l.waits[lease]
	if m == nil {
		m = make(map[string][]chan outcome)
		l.waits[lease] = m
	}
	m[name] = append(m[name], ch)
	return ch
}

func (l *Leader) unregister(lease core.LeaseID, name string, ch chan outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.waits[lease]
	chans := m[name]
	for i, c := range chans {
		if c == ch {
			chans = append(chans[:i], chans[i+1:]...)
			break
		}
	}
	if len(chans) == 0 {
		delete(m, name)
	} else {
		m[name] = chans
	}
	if len(m) == 0 {
		delete(l.waits, lease)
	}
}

func (l *Leader) notifyLocked(lease core.LeaseID, name string, o outcome) {
	for _, ch := range l.waits[lease][name] {
		select {
		case ch <- o:
		default:
		}
	}
}

func (l *Leader) notifyLeaseLocked(lease core.LeaseID, err error) {
	for name := range l.waits[lease] {
		l.notifyLocked(lease, name, outcome{err: err})
	}
}
