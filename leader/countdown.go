package leader

import (
	"container/heap"
	"time"

	"github.com/leasehold/leasehold/core"
)

// countdown is one lease's expiry deadline on this leader's monotonic clock. Times are
// offsets from Leader.base (Leader.now), 8 bytes each where a time.Time takes 24: a
// leader keeps one countdown per live lease.
type countdown struct {
	id       core.LeaseID
	ttl      time.Duration
	deadline time.Duration // since Leader.base, on the monotonic clock: immune to wall-clock steps
	index    int32         // in the heap
	expiring bool          // an Expire is being proposed; keepalives are refused
	// lost is set once the replicated state holds lost locks for the lease (it never
	// drops them while the lease lives), so that only their keepalives read the state.
	lost bool
}

// countdownHeap orders countdowns by when the expiry loop must next look at them; it
// implements heap.Interface. A keepalive only moves its countdown's deadline later and
// leaves the heap alone, so a countdown's place (due) may be earlier than its deadline,
// never later: the expiry loop, finding a countdown due whose deadline has not passed,
// moves it to its deadline (one heap fix per lease and TTL at most, instead of one per
// keepalive, and none on a keepalive's path). The key is kept in the heap beside the
// pointer, so ordering reads no countdown.
type countdownHeap []queued

type queued struct {
	due time.Duration // since Leader.base; at or before c.deadline, unless c is parked (expiring)
	c   *countdown
}

func (h countdownHeap) Len() int           { return len(h) }
func (h countdownHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h countdownHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].c.index, h[j].c.index = int32(i), int32(j)
}
func (h *countdownHeap) Push(x any) {
	q := x.(queued)
	q.c.index = int32(len(*h))
	*h = append(*h, q)
}
func (h *countdownHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = queued{}
	*h = old[:len(old)-1]
	q.c.index = -1
	return q
}

// setDue moves c in the heap to due, and its deadline with it.
func (h *countdownHeap) setDue(c *countdown, due time.Duration) {
	c.deadline = due
	h.park(c, due)
}

// park moves c in the heap to due and leaves its deadline alone: an expiring lease keeps
// the deadline it expired at (its expiry's lateness is measured from it).
func (h *countdownHeap) park(c *countdown, due time.Duration) {
	(*h)[c.index].due = due
	heap.Fix(h, int(c.index))
}

// addCountdownLocked starts lease's countdown at full TTL from now (l.now), unless it is
// already counting, and returns it.
func (l *Leader) addCountdownLocked(id core.LeaseID, ttlMillis int64, now time.Duration) *countdown {
	if c := l.leases[id]; c != nil {
		return c
	}
	ttl := time.Duration(ttlMillis) * time.Millisecond
	c := &countdown{id: id, ttl: ttl, deadline: now + ttl}
	l.leases[id] = c
	heap.Push(&l.queue, queued{due: c.deadline, c: c})
	l.kickIfFirstLocked(c)
	return c
}

// kickIfFirstLocked wakes the expiry loop when c is now the first countdown due: the
// loop may be asleep until a later one.
func (l *Leader) kickIfFirstLocked(c *countdown) {
	if c.index == 0 && l.kick != nil {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// maxExpiring bounds the expiry proposals in flight (the replication batcher puts them
// in few entries: up to 1,024 commands each). With 256, the expiry loop waited for a
// commit every 256 leases: a million leases falling due over ten seconds expired up to
// 8 s late with the server at a third of a core (the scale-expiry run); 4,096 is four
// full batches per log write.
const maxExpiring = 4096

// maxQueueOps bounds the countdown-heap operations (a lease put back at its renewed
// deadline, or parked as expiring) the expiry loop does in one hold of Leader.mu. Each
// costs a walk down a heap of up to a million leases, a microsecond or two of cache
// misses; a million leases granted in a few seconds fall due for a look in the same few
// seconds thirty seconds later, and without a bound one hold put back a hundred thousand
// of them while every keepalive and acquire waited for the lock (other clients' acquire
// p99 20–40 ms in the scale-expiry run).
const maxQueueOps = 256

// expiryLoop proposes Expire for every lease whose deadline has passed, until stop. It
// proposes with Log.ApplyThen, so no goroutine waits for a commit: a slot of maxExpiring
// is taken per proposal and given back by its callback, and the loop waits for a slot
// only when that many are in flight.
func (l *Leader) expiryLoop(stop, kick chan struct{}) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	sem := make(chan struct{}, maxExpiring)
	for {
		now := l.now()
		l.mu.Lock()
		var due []*countdown
		ops := 0
		for ; ops < maxQueueOps && len(l.queue) > 0 && l.queue[0].due <= now; ops++ {
			c := l.queue[0].c
			if c.deadline > now {
				// Renewed since it was placed: look again at its deadline.
				l.queue.setDue(c, c.deadline)
				continue
			}
			c.expiring = true
			// Park it far in the future until the expiry is applied or retried.
			l.queue.park(c, now+24*time.Hour)
			due = append(due, c)
		}
		next := time.Hour
		if len(l.queue) > 0 {
			next = max(0, l.queue[0].due-l.now())
		}
		if ops == maxQueueOps {
			next = 0 // more may be due: look again once the lock has been let go
		}
		l.mu.Unlock()
		for _, c := range due {
			select {
			case sem <- struct{}{}:
			case <-stop:
				return
			}
			l.log.ApplyThen(core.Command{Op: core.OpExpire, Lease: c.id}, func(_ core.Result, err error) {
				l.expired(stop, c, err)
				<-sem
			})
		}
		timer.Reset(next)
		select {
		case <-stop:
			return
		case <-kick:
		case <-timer.C:
		}
	}
}

// expired takes the outcome of c's expiry proposal. Applied, OnEffects has dropped the
// countdown (for a lease that had already ended there is nothing to drop). Failed, this
// node may have lost leadership (Demote then ends the term, and the next leader counts
// afresh) or the outcome is unknown: while the term lasts the expiry is proposed again
// shortly, and the lease stays expiring, refusing keepalives, since it may be gone
// already. It runs on the log's goroutine that hands out results: it must not block.
func (l *Leader) expired(stop chan struct{}, c *countdown, err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-stop:
		return
	default:
	}
	if l.leases[c.id] != c {
		return
	}
	l.lg.Warn("expiry not confirmed, retrying", "lease", c.id, "err", err)
	l.queue.park(c, l.now()+100*time.Millisecond)
	l.kickIfFirstLocked(c)
}
