package leader

import (
	"container/heap"
	"slices"
	"time"

	"github.com/leasehold/leasehold/core"
)

// countdown is one lease's expiry deadline on this leader's monotonic clock. Times are
// offsets from Leader.base (Leader.now), 8 bytes each where a time.Time takes 24: a
// leader keeps one countdown per live lease, by value in Leader.leases, with no pointer
// in it. A keepalive so reads one map slot (a million leases' slots do not fit a cache:
// each keepalive's lookup is a cache and TLB miss, and a pointer to follow from there
// was a second one, 15% of the server's CPU at a million leases), and the garbage
// collector has nothing to mark per lease.
type countdown struct {
	ttl      time.Duration
	deadline time.Duration // since Leader.base, on the monotonic clock: immune to wall-clock steps
	seq      uint64        // the sequence number of its entry in the queue, while queued
	queued   bool          // it has an entry in the queue: always, except while an Expire is proposed
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
// lease ID, so ordering reads no countdown.
//
// An entry names its lease and the sequence number it was queued with; it is the
// lease's own only while the countdown has that number and is queued. A lease that ends
// leaves its entry behind, stale, to be dropped when it comes up (or by compaction,
// when stale entries are the majority): the heap so needs no back-pointers, and
// nothing is written into a countdown when the heap moves its entries.
type countdownHeap []queued

type queued struct {
	due time.Duration // since Leader.base; at or before the countdown's deadline
	id  core.LeaseID
	seq uint64
}

func (h countdownHeap) Len() int           { return len(h) }
func (h countdownHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h countdownHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *countdownHeap) Push(x any)        { *h = append(*h, x.(queued)) }
func (h *countdownHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	*h = old[:len(old)-1]
	return q
}

// liveLocked reports whether the queue's entry q is its lease's own, and returns the
// countdown.
func (l *Leader) liveLocked(q queued) (countdown, bool) {
	c, ok := l.leases[q.id]
	return c, ok && c.queued && c.seq == q.seq
}

// queueLocked gives lease id's countdown c (not queued) an entry in the queue at due,
// stores c, and wakes the expiry loop when it is now the first due: the loop may be
// asleep until a later one.
func (l *Leader) queueLocked(id core.LeaseID, c countdown, due time.Duration) {
	l.queueSeq++
	c.seq, c.queued = l.queueSeq, true
	l.leases[id] = c
	heap.Push(&l.queue, queued{due: due, id: id, seq: c.seq})
	if l.queue[0].seq == c.seq && l.kick != nil {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// dropCountdownLocked forgets lease id's countdown, its lease having ended, and returns
// it. Its entry in the queue, if any, stays behind stale; once stale entries are more
// than half the queue, the queue is rebuilt without them.
func (l *Leader) dropCountdownLocked(id core.LeaseID) (countdown, bool) {
	c, ok := l.leases[id]
	if !ok {
		return c, false
	}
	delete(l.leases, id)
	if c.queued {
		l.staleQueued++
		if l.staleQueued > 1024 && l.staleQueued > len(l.queue)/2 {
			l.queue = slices.DeleteFunc(l.queue, func(q queued) bool {
				_, live := l.liveLocked(q)
				return !live
			})
			heap.Init(&l.queue)
			l.staleQueued = 0
		}
	}
	return c, true
}

// addCountdownLocked starts lease's countdown at full TTL from now (l.now), unless it is
// already counting; lost is whether the lease holds lost locks in the replicated state.
func (l *Leader) addCountdownLocked(id core.LeaseID, ttlMillis int64, now time.Duration, lost bool) {
	if _, ok := l.leases[id]; ok {
		return
	}
	ttl := time.Duration(ttlMillis) * time.Millisecond
	l.queueLocked(id, countdown{ttl: ttl, deadline: now + ttl, lost: lost}, now+ttl)
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
		var due []core.LeaseID
		ops := 0
		for ; ops < maxQueueOps && len(l.queue) > 0 && l.queue[0].due <= now; ops++ {
			top := l.queue[0]
			c, live := l.liveLocked(top)
			switch {
			case !live:
				// Its lease ended (dropCountdownLocked).
				heap.Pop(&l.queue)
				l.staleQueued--
			case c.deadline > now:
				// Renewed since it was placed: look again at its deadline.
				l.queue[0].due = c.deadline
				heap.Fix(&l.queue, 0)
			default:
				// Out of the queue until the expiry is applied (the lease ends) or
				// fails (expired queues it again).
				heap.Pop(&l.queue)
				c.expiring, c.queued = true, false
				l.leases[top.id] = c
				due = append(due, top.id)
			}
		}
		next := time.Hour
		if len(l.queue) > 0 {
			next = max(0, l.queue[0].due-l.now())
		}
		if ops == maxQueueOps {
			next = 0 // more may be due: look again once the lock has been let go
		}
		l.mu.Unlock()
		for _, id := range due {
			select {
			case sem <- struct{}{}:
			case <-stop:
				return
			}
			l.log.ApplyThen(core.Command{Op: core.OpExpire, Lease: id}, func(_ core.Result, err error) {
				l.expired(stop, id, err)
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

// expired takes the outcome of lease id's expiry proposal. Applied, OnEffects has
// dropped the countdown (for a lease that had already ended there is nothing to drop).
// Failed, this node may have lost leadership (Demote then ends the term, and the next
// leader counts afresh) or the outcome is unknown: while the term lasts the expiry is
// proposed again shortly, and the lease stays expiring, refusing keepalives, since it
// may be gone already. It runs on the log's goroutine that hands out results: it must
// not block.
func (l *Leader) expired(stop chan struct{}, id core.LeaseID, err error) {
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
	c, ok := l.leases[id]
	if !ok || !c.expiring || c.queued {
		return
	}
	l.lg.Warn("expiry not confirmed, retrying", "lease", id, "err", err)
	l.queueLocked(id, c, l.now()+100*time.Millisecond)
}
