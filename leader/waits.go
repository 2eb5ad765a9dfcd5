package leader

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/leasehold/leasehold/core"
)

// outcome is what a queued acquire learns: its grant's token, or why it will not be
// granted.
type outcome struct {
	token uint64
	err   error
}

// waits registers the acquires waiting in a queue for their grant, by lease and name. An
// acquire registers (add) before its place in the queue can be granted; the effect that
// grants it, or that ends its lease, wakes it (notify, failLease); it unregisters
// (remove) when it stops waiting. Its mutex is a leaf: it may be taken with Leader.mu
// held, and nothing is taken under it.
type waits struct {
	mu sync.Mutex
	m  map[core.LeaseID]map[string][]chan outcome
	// undoing counts, per acquire (lease, name), the undos of its place or grant under
	// way because a caller left (see Leader.undo); nil until the first.
	undoing map[waitKey]int
}

type waitKey struct {
	lease core.LeaseID
	name  string
}

// add registers a wait of lease for name and returns the channel its outcome comes on.
func (w *waits) add(lease core.LeaseID, name string) chan outcome {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.addLocked(lease, name)
}

func (w *waits) addLocked(lease core.LeaseID, name string) chan outcome {
	ch := make(chan outcome, 1)
	m := w.m[lease]
	if m == nil {
		m = make(map[string][]chan outcome)
		w.m[lease] = m
	}
	m[name] = append(m[name], ch)
	return ch
}

// addUnlessUndoing is add, unless an undo of lease's acquire of name is under way:
// then it registers nothing and reports false.
func (w *waits) addUnlessUndoing(lease core.LeaseID, name string) (chan outcome, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.undoing[waitKey{lease, name}] > 0 {
		return nil, false
	}
	return w.addLocked(lease, name), true
}

// newer reports whether a wait of lease for name registered after ch is: a later
// attempt of the same acquire (the client's retry, made after it gave the attempt of ch
// up). An earlier attempt does not count: the client has given it up, and it may be
// waiting on a connection whose loss this node has not yet seen (a cut path shows only
// when TCP's keepalives fail); were it to keep the place, it could be granted with its
// answer going nowhere.
func (w *waits) newer(lease core.LeaseID, name string, ch chan outcome) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.newerLocked(lease, name, ch)
}

func (w *waits) newerLocked(lease core.LeaseID, name string, ch chan outcome) bool {
	chans := w.m[lease][name]
	for i, c := range chans {
		if c == ch {
			return i < len(chans)-1
		}
	}
	return len(chans) > 0 // ch is not registered (any more): every wait is newer
}

// claimUndo unregisters ch and marks an undo of lease's acquire of name as under way
// (until undone is called), and reports true; unless another wait of lease for name
// owns the place or grant — then it only unregisters ch and reports false. The owner
// is, with newerOnly, a wait registered after ch (see newer: an attempt whose wait
// ended); otherwise any other wait (for a commit whose caller left: an earlier attempt
// still committing may be answered with the very grant, and must not lose it).
func (w *waits) claimUndo(lease core.LeaseID, name string, ch chan outcome, newerOnly bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	owned := slices.ContainsFunc(w.m[lease][name], func(c chan outcome) bool { return c != ch })
	if newerOnly {
		owned = w.newerLocked(lease, name, ch)
	}
	w.removeLocked(lease, name, ch)
	if owned {
		return false
	}
	if w.undoing == nil {
		w.undoing = make(map[waitKey]int)
	}
	w.undoing[waitKey{lease, name}]++ // two attempts' undos may overlap: the last one ends it
	return true
}

// undone ends an undo claimUndo marked.
func (w *waits) undone(lease core.LeaseID, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := waitKey{lease, name}
	if w.undoing[k]--; w.undoing[k] <= 0 {
		delete(w.undoing, k)
	}
}

// remove unregisters the wait whose channel is ch.
func (w *waits) remove(lease core.LeaseID, name string, ch chan outcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removeLocked(lease, name, ch)
}

func (w *waits) removeLocked(lease core.LeaseID, name string, ch chan outcome) {
	m := w.m[lease]
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
		delete(w.m, lease)
	}
}

// notify hands o to every wait of lease for name. It never blocks: a channel holds one
// outcome, and a wait takes only the first.
func (w *waits) notify(lease core.LeaseID, name string, o outcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.notifyLocked(lease, name, o)
}

func (w *waits) notifyLocked(lease core.LeaseID, name string, o outcome) {
	for _, ch := range w.m[lease][name] {
		select {
		case ch <- o:
		default:
		}
	}
}

// failLease ends every wait of lease with err.
func (w *waits) failLease(lease core.LeaseID, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name := range w.m[lease] {
		w.notifyLocked(lease, name, outcome{err: err})
	}
}

// failAll ends every wait, each with errFor(its name). errFor must take no lock.
func (w *waits) failAll(errFor func(name string) error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for lease, m := range w.m {
		for name := range m {
			w.notifyLocked(lease, name, outcome{err: errFor(name)})
		}
	}
}

// await waits for a queued acquire's grant, the end of its wait, or ctx.
func (l *Leader) await(ctx context.Context, a AcquireArgs, ch chan outcome, queued core.Result) (Grant, error) {
	defer l.waits.remove(a.Lease, a.Key(), ch)
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
		why := l.explain(a, heldName(a, queued)) // while the caller still has its place
		held := &LockHeldError{Name: heldName(a, queued), HolderToken: queued.HolderToken, Holder: queued.Holder, Waited: true, Explain: why}
		if a.Class == core.Correctness && l.waits.newer(a.Lease, a.Key(), ch) {
			// A later attempt of this acquire (the client's retry, after it gave this one
			// up) waits for the same place: it is that attempt's now, to keep or cancel.
			return g, held
		}
		tok, err := l.cancelWait(context.WithoutCancel(ctx), a, ch)
		if err != nil || tok != 0 {
			g.Token = tok
			return g, err
		}
		return g, held
	case <-ctx.Done():
		if a.Class == core.Correctness {
			select {
			case o := <-ch:
				// The outcome came as the caller left: answered as if it had come first
				// (see acquireCorrectness).
				g.Token = o.token
				return g, o.err
			default:
			}
			// The caller is gone: leave the queue, and give back a grant that raced us —
			// unless another attempt of this acquire waits for it.
			l.undo(acquireTakeBack(a), ch, 0, true)
			return g, ctx.Err()
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		// The caller is gone: leave the queue, and give back a grant that raced us.
		if tok, err := l.cancelWait(cctx, a, ch); err == nil && tok != 0 {
			_ = l.Release(cctx, a.Lease, a.Key(), tok)
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
			return 0, ErrEpochLost // the table it waited in went with the leadership
		}
		// Leaving a queue may let others through (readers behind a writer, a lock set's
		// free names): their grants are woken here.
		res = l.eff.CancelWait(a.Lease, a.Key(), &l.effSeq)
		l.effEffectsLocked(res.Effects)
		l.mu.Unlock()
	} else {
		var err error
		res, err = l.log.Apply(ctx, core.Command{Op: core.OpCancelWait, Lease: a.Lease, Name: a.Key()})
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
