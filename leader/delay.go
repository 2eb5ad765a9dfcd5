package leader

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/core"
)

type delay struct {
	deadline time.Time
	timer    *time.Timer
}

func (l *Leader) startDelayLocked(name string, class core.Class, millis int64) {
	if d := l.delays[name]; d != nil {
		d.timer.Stop()
	}
	d := &delay{deadline: time.Now().Add(time.Duration(millis) * time.Millisecond)}
	stop := l.stop
	d.timer = time.AfterFunc(time.Duration(millis)*time.Millisecond, func() {
		select {
		case <-stop:
			return
		default:
		}
		if class == core.Efficiency {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.delays[name] == d {
				delete(l.delays, name)
				var r core.Result
				l.eff.EndDelay(name, &l.effSeq, &r)
				l.effEffectsLocked(r.Effects)
			}
			return
		}
		if _, err := l.log.Apply(context.Background(), core.Command{Op: core.OpEndDelay, Name: name}); err != nil {
			l.lg.Warn("could not end lock-delay", "name", name, "err", err)
		}
		l.mu.Lock()
		if l.delays[name] == d {
			delete(l.delays, name)
		}
		l.mu.Unlock()
	})
	l.delays[name] = d
}
