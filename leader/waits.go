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
	m  map[core.LeaseID]map[string]*waitList
	// undoing counts, per acquire (lease, name), the undos of its place or grant under
	// way because a caller left (see Leader.undo); nil until the first.
	undoing map[waitKey]int
}

type waitKey struct {
	lease core.LeaseID
	name  string
}

// waitList is the waits of one lease for one name, oldest first: the attempts of one
// acquire (or campaign), since a lease has one place, or one grant, per name.
type waitList struct {
	chans []chan outcome
	// granted: since the first of these waits registered, a grant was handed to one of
	// them (notify, or answered), and it may have reached a caller who still holds it.
	granted bool
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
		m = make(map[string]*waitList)
		w.m[lease] = m
	}
	wl := m[name]
	if wl == nil {
		wl = &waitList{}
		m[name] = wl
	}
	wl.chans = append(wl.chans, ch)
	return ch
}

// list returns lease's waits for name; nil when there are none.
func (w *waits) list(lease core.LeaseID, name string) *waitList { return w.m[lease][name] }

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

// newerLocked reports whether a wait of lease for name registered after ch is: a later
// attempt of the same acquire (the client's retry, made after it gave the attempt of ch
// up). w.mu is held.
func (w *waits) newerLocked(lease core.LeaseID, name string, ch chan outcome) bool {
	wl := w.list(lease, name)
	if wl == nil {
		return false
	}
	for i, c := range wl.chans {
		if c == ch {
			return i < len(wl.chans)-1
		}
	}
	return len(wl.chans) > 0 // ch is not registered (any more): every wait is newer
}

// claimUndo unregisters ch and marks an undo of lease's acquire of name as under way
// (until undone is called), and reports true; unless another wait of lease for name
// owns the place or grant — then it only unregisters ch and reports false.
//
// A lease has one place, or one grant, per name, shared by every attempt of the
// acquire: taking it back takes it from all of them. So nothing is taken back once a
// grant was handed to one of the waits (waitList.granted: it may be held by a caller
// who is still there, with its token), and:
//
//   - for a commit whose caller left (leaving false), every other wait owns what it
//     made: an attempt still committing or waiting will be answered with it;
//   - for a wait whose caller left or whose wait ran out (leaving true), a wait
//     registered after ch owns it (the client's retry, after it gave ch's attempt up:
//     newer). Attempts registered before ch are not left waiting for a place that is
//     going away, nor answered with a grant about to be released: they are ended with
//     ErrUndoing, which their client, if it is still there, sends again after a pause
//     (and then waits anew, at the back of the queue). An attempt the client gave up —
//     one that may be waiting on a connection whose loss this node has not seen yet —
//     so no longer keeps the place for an answer that would go nowhere.
func (w *waits) claimUndo(lease core.LeaseID, name string, ch chan outcome, leaving bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	var owned bool
	if wl := w.list(lease, name); wl != nil {
		if leaving {
			owned = wl.granted || w.newerLocked(lease, name, ch)
		} else {
			owned = wl.granted || slices.ContainsFunc(wl.chans, func(c chan outcome) bool { return c != ch })
		}
	}
	w.removeLocked(lease, name, ch)
	if owned {
		return false
	}
	if leaving {
		w.notifyLocked(lease, name, outcome{err: ErrUndoing}) // the earlier attempts
	}
	if w.undoing == nil {
		w.undoing = make(map[waitKey]int)
	}
	w.undoing[waitKey{lease, name}]++ // two attempts' undos may overlap: the last one ends it
	return true
}

// answer unregisters ch, whose caller its commit's result answers (granted: with a
// grant, which none of the other waits of lease for name may then take back, see
// claimUndo). It reports false, and the caller must answer ErrUndoing instead, when an
// undo of another attempt ended ch's wait first (claimUndo): what the result says is
// being taken back.
func (w *waits) answer(lease core.LeaseID, name string, ch chan outcome, granted bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	defer w.removeLocked(lease, name, ch)
	if o, ok := arrived(ch); ok && errors.Is(o.err, ErrUndoing) {
		return false
	}
	if wl := w.list(lease, name); wl != nil && granted {
		wl.granted = true
	}
	return true
}

// arrived returns the outcome already waiting on ch, if there is one.
func arrived(ch chan outcome) (outcome, bool) {
	select {
	case o := <-ch:
		return o, true
	default:
		return outcome{}, false
	}
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
	wl := m[name]
	if wl == nil {
		return
	}
	for i, c := range wl.chans {
		if c == ch {
			wl.chans = append(wl.chans[:i], wl.chans[i+1:]...)
			break
		}
	}
	if len(wl.chans) == 0 {
		delete(m, name)
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
	wl := w.list(lease, name)
	if wl == nil {
		return
	}
	if o.err == nil && o.token != 0 {
		wl.granted = true
	}
	for _, ch := range wl.chans {
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
		if o, ok := arrived(ch); ok { // the outcome came with the end of the wait: answered
			g.Token = o.token
			return g, o.err
		}
		if !l.waits.claimUndo(a.Lease, a.Key(), ch, true) {
			// A later attempt of this acquire (the client's retry, after it gave this one
			// up) waits for the same place, or another attempt was granted it: it is
			// that attempt's now, to keep or cancel.
			return g, held
		}
		tok, err := l.cancelWait(context.WithoutCancel(ctx), a, ch)
		l.waits.undone(a.Lease, a.Key())
		if err != nil || tok != 0 {
			g.Token = tok
			return g, err
		}
		return g, held
	case <-ctx.Done():
		if a.Class == core.Correctness {
			if o, ok := arrived(ch); ok {
				// The outcome came as the caller left: answered as if it had come first
				// (see acquireCorrectness).
				g.Token = o.token
				return g, o.err
			}
			// The caller is gone: leave the queue, and give back a grant that raced us —
			// unless another attempt of this acquire waits for it.
			l.undo(acquireTakeBack(a), ch, 0, true)
			return g, ctx.Err()
		}
		// The caller is gone: leave the queue, and give back a grant that raced us —
		// unless another attempt of this acquire owns them (claimUndo).
		if !l.waits.claimUndo(a.Lease, a.Key(), ch, true) {
			return g, ctx.Err()
		}
		defer l.waits.undone(a.Lease, a.Key())
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
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
		if o, ok := arrived(ch); ok { // the outcome arrived meanwhile
			return o.token, o.err
		}
		if errors.Is(res.Err, core.ErrLeaseNotFound) {
			return 0, l.gone(a.Lease)
		}
		return 0, nil // not waiting any more: report the timeout
	}
	return res.Token, nil
}
