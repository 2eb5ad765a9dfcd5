package leader

import "github.com/leasehold/leasehold/core"

// LeaseLocks returns how many locks lease holds or waits for, of both classes, as this
// node sees them (server's per-identity quotas count them).
func (l *Leader) LeaseLocks(lease core.LeaseID) int {
	n := 0
	l.log.Read(func(st *core.State) { n = st.Locks().LeaseLocks(lease) })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.eff != nil {
		n += l.eff.LeaseLocks(lease)
	}
	return n
}
