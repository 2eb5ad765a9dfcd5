package leader

// QueueLen returns how many entries the countdown queue holds, stale ones included.
func (l *Leader) QueueLen() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}
