package verify

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// Outcome is what became of one write.
type Outcome string

// The outcomes of a write.
const (
	// Accepted: the resource answered that it applied the write.
	Accepted Outcome = "accepted"
	// Rejected: the resource answered that it refused the write for its token.
	Rejected Outcome = "rejected"
	// Unknown: no answer, or an answer that is neither; the write may or may not have
	// been applied.
	Unknown Outcome = "unknown"
)

// Verdict is the result of a run.
type Verdict string

// The verdicts.
const (
	// Pass: stale writes were attempted, and the history shows the resource never
	// accepted a token lower than one it had accepted before, nor refused a current one.
	Pass Verdict = "PASS"
	// Fail: the history breaks the rule; Report.Violations shows how.
	Fail Verdict = "FAIL"
	// Inconclusive: no stale write was attempted, so the run says nothing about
	// fencing. Run longer, or with a higher PauseChance.
	Inconclusive Verdict = "INCONCLUSIVE"
)

// Write is one recorded write.
type Write struct {
	Writer  int
	Seq     int // its place in the writer's tenure
	Token   uint64
	Call    time.Time
	Return  time.Time // zero when no answer came
	Outcome Outcome
	Detail  string // the HTTP status or error, for a write that was not accepted
}

func (w Write) String() string {
	ret := "no answer"
	if !w.Return.IsZero() {
		ret = w.Return.Format("15:04:05.000000")
	}
	s := fmt.Sprintf("writer %d token %d: sent %s, answered %s: %s", w.Writer, w.Token, w.Call.Format("15:04:05.000000"), ret, w.Outcome)
	if w.Detail != "" {
		s += " (" + w.Detail + ")"
	}
	return s
}

// Violation is a pair of writes that no fenced resource could have answered as this one
// did: Later was sent after Earlier had been accepted, yet the resource accepted Later's
// lower token (a stale write got through) — or Earlier is nil and the resource refused
// Later although no write it had accepted carried a higher token (a false rejection).
type Violation struct {
	Earlier *Write
	Later   Write
}

func (v Violation) String() string {
	if v.Earlier == nil {
		return "refused a current token: " + v.Later.String()
	}
	return fmt.Sprintf("accepted a stale token: %s\n      after it had accepted: %s", v.Later, *v.Earlier)
}

// Report is the result of Run.
type Report struct {
	Verdict Verdict
	// Target is the resource: the URL, or the SQL table and whether the guard was used.
	Target string
	// Linearizable is porcupine's answer: whether some order of the writes, each taking
	// effect between its call and its answer, is one a fenced resource could produce.
	// CheckTimedOut is set when porcupine gave up (a minute); the verdict then rests on
	// Violations alone.
	Linearizable, CheckTimedOut bool
	// Violations are offending pairs found directly in the history (at most 20): when
	// Linearizable is false they show why.
	Violations []Violation
	Writes     []Write
	// StaleAttempts counts writes sent with a token lower than one the resource had
	// accepted (and answered) before they were sent: the writes fencing exists for.
	StaleAttempts                int
	Accepted, Rejected, Unknowns int
	Seed                         uint64
	Pauses, Grants, Writers      int
	Lock                         string
	WriterErrors                 []string
}

// Print writes the report for a person.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "verdict: %s\n", r.Verdict)
	if r.Target != "" {
		fmt.Fprintf(w, "  target: %s\n", r.Target)
	}
	fmt.Fprintf(w, "  %d writers took lock %q %d times; %d pauses past the TTL\n", r.Writers, r.Lock, r.Grants, r.Pauses)
	fmt.Fprintf(w, "  %d writes: %d accepted, %d rejected, %d unknown; %d stale writes attempted\n", len(r.Writes), r.Accepted, r.Rejected, r.Unknowns, r.StaleAttempts)
	switch r.Verdict {
	case Pass:
		fmt.Fprintln(w, "  the resource never accepted a token lower than one it had accepted before")
	case Inconclusive:
		fmt.Fprintln(w, "  no stale write was attempted: the run proves nothing; run longer (--duration) or pause more (--pause-chance)")
	case Fail:
		if len(r.Violations) == 0 {
			fmt.Fprintln(w, "  no order of the writes fits a fenced resource (porcupine), though no single pair shows it")
		}
		for i, v := range r.Violations {
			if i == 5 {
				fmt.Fprintf(w, "  … and %d more (Report.Violations, or --output json)\n", len(r.Violations)-i)
				break
			}
			fmt.Fprintf(w, "  - %s\n", v)
		}
	}
	if r.CheckTimedOut {
		fmt.Fprintln(w, "  (porcupine gave up after a minute; the verdict rests on the pairs above)")
	}
	for _, e := range r.WriterErrors {
		fmt.Fprintf(w, "  writer error: %s\n", e)
	}
	fmt.Fprintf(w, "  reproduce the pause schedule with --seed %d\n", r.Seed)
}

// check builds the report of a history of writer events.
func check(history []event) *Report {
	r := &Report{}
	for _, e := range history {
		if e.Ev != "write" {
			continue
		}
		w := Write{Writer: e.Writer, Seq: e.Seq, Token: e.Token, Call: time.Unix(0, e.Call), Outcome: e.Out, Detail: e.Detail}
		if e.Ret != 0 {
			w.Return = time.Unix(0, e.Ret)
		}
		r.Writes = append(r.Writes, w)
		switch w.Outcome {
		case Accepted:
			r.Accepted++
		case Rejected:
			r.Rejected++
		default:
			r.Unknowns++
		}
	}
	slices.SortFunc(r.Writes, func(a, b Write) int { return a.Call.Compare(b.Call) })
	switch linearizable(r.Writes) {
	case porcupine.Ok:
		r.Linearizable = true
	case porcupine.Unknown:
		r.Linearizable, r.CheckTimedOut = true, true
	}
	r.StaleAttempts, r.Violations = findViolations(r.Writes)
	switch {
	case !r.Linearizable || len(r.Violations) > 0:
		r.Verdict = Fail
	case r.StaleAttempts == 0:
		r.Verdict = Inconclusive
	default:
		r.Verdict = Pass
	}
	return r
}

// findViolations scans the writes (sorted by call) for stale writes attempted, stale
// writes accepted, and current tokens refused, each judged against the writes that had
// been answered before it was sent.
func findViolations(writes []Write) (stale int, out []Violation) {
	byReturn := make([]int, 0, len(writes))
	for i, w := range writes {
		if w.Outcome == Accepted && !w.Return.IsZero() {
			byReturn = append(byReturn, i)
		}
	}
	slices.SortFunc(byReturn, func(a, b int) int { return writes[a].Return.Compare(writes[b].Return) })
	for _, w := range writes {
		// The accepted write with the highest token answered before w was sent.
		var best *Write
		for _, i := range byReturn {
			if !writes[i].Return.Before(w.Call) {
				break
			}
			if best == nil || writes[i].Token > best.Token {
				best = &writes[i]
			}
		}
		// The highest token the resource may have accepted before w took effect: any
		// write sent before w's answer and not refused.
		possible := uint64(0)
		for _, o := range writes {
			if o.Outcome != Rejected && (w.Return.IsZero() || o.Call.Before(w.Return)) && o.Token > possible {
				possible = o.Token
			}
		}
		switch {
		case best != nil && w.Token < best.Token:
			stale++
			if w.Outcome == Accepted && len(out) < 20 {
				out = append(out, Violation{Earlier: best, Later: w})
			}
		case w.Outcome == Rejected && w.Token >= possible && len(out) < 20:
			out = append(out, Violation{Later: w})
		}
	}
	return stale, out
}

// linearizable checks the writes against a fenced resource: a register of the highest
// accepted token, which accepts a token not lower than it (and raises it) and refuses a
// lower one. A write of unknown outcome may or may not have taken effect.
func linearizable(writes []Write) porcupine.CheckResult {
	model := porcupine.NondeterministicModel{
		Init: func() []any { return []any{uint64(0)} },
		Step: func(state, input, output any) []any {
			highest, token, out := state.(uint64), input.(uint64), output.(Outcome)
			switch out {
			case Accepted:
				if token >= highest {
					return []any{token}
				}
				return nil
			case Rejected:
				if token < highest {
					return []any{highest}
				}
				return nil
			default:
				if token >= highest {
					return []any{highest, token}
				}
				return []any{highest}
			}
		},
		DescribeOperation: func(input, output any) string { return fmt.Sprintf("write(%d) → %s", input, output) },
	}
	var ops []porcupine.Operation
	end := int64(0)
	for _, w := range writes {
		if !w.Return.IsZero() {
			end = max(end, w.Return.UnixNano())
		}
	}
	for _, w := range writes {
		ret := w.Return.UnixNano()
		if w.Return.IsZero() {
			ret = end + 1<<40 // may still take effect: it returns after everything
		}
		ops = append(ops, porcupine.Operation{ClientId: w.Writer, Input: w.Token, Output: w.Outcome, Call: w.Call.UnixNano(), Return: ret})
	}
	return porcupine.CheckOperationsTimeout(model.ToModel(), ops, time.Minute)
}
