// Package phases times the steps of a multi-step operation (a create's
// prepare, runtime start, agent start...) so that the daemon's debug log
// says where the time of each one went: per-phase figures are far steadier
// than wall time on a loaded host, and `sbx-bench -only scale` reads them.
//
// It imports nothing from sbx and may be imported by any package.
package phases

import (
	"log/slog"
	"strings"
	"time"
)

// Timer records named marks. The zero Timer is not ready: use Start. A
// Timer is used by one goroutine.
type Timer struct {
	start, last time.Time
	marks       []mark
}

type mark struct {
	name string
	d    time.Duration
}

// Start returns a Timer whose first phase begins now.
func Start() *Timer {
	now := time.Now()
	return &Timer{start: now, last: now}
}

// Mark ends the phase called name (it began at the previous mark or at
// Start). Marking a name again adds to it.
func (t *Timer) Mark(name string) {
	now := time.Now()
	d := now.Sub(t.last)
	t.last = now
	for i := range t.marks {
		if t.marks[i].name == name {
			t.marks[i].d += d
			return
		}
	}
	t.marks = append(t.marks, mark{name, d})
}

// Total is the time since Start.
func (t *Timer) Total() time.Duration { return time.Since(t.start) }

// String renders the phases as "name=1.23ms name=0.45ms ...", in the order
// they were first marked, then total.
func (t *Timer) String() string {
	var b strings.Builder
	for _, m := range t.marks {
		b.WriteString(m.name)
		b.WriteByte('=')
		b.WriteString(m.d.Round(10 * time.Microsecond).String())
		b.WriteByte(' ')
	}
	b.WriteString("total=")
	b.WriteString(t.Total().Round(10 * time.Microsecond).String())
	return b.String()
}

// LogValue makes a Timer a slog attribute value (its String).
func (t *Timer) LogValue() slog.Value { return slog.StringValue(t.String()) }
