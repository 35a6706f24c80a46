package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/sandbox"
)

// eventTypeOf parses a short event type name ("created", "exec_ended").
func eventTypeOf(s string) (sbxv1.EventType, error) {
	v, ok := sbxv1.EventType_value["EVENT_TYPE_"+strings.ToUpper(strings.ReplaceAll(s, "-", "_"))]
	if !ok || v == 0 {
		var names []string
		for n := int32(1); int(n) < len(sbxv1.EventType_name); n++ {
			names = append(names, eventTypeWord(sbxv1.EventType(n)))
		}
		return 0, fmt.Errorf("event type %q: unknown (have %s)", s, strings.Join(names, ", "))
	}
	return sbxv1.EventType(v), nil
}

// eventTypeWord is an event type's short name ("exec_ended").
func eventTypeWord(t sbxv1.EventType) string {
	return strings.ToLower(strings.TrimPrefix(t.String(), "EVENT_TYPE_"))
}

// parseEventFilters turns --filter terms (type=T, sandbox=ID|NAME,
// label=SELECTOR; several in one flag separated by commas) into req.
func parseEventFilters(terms []string, req *sbxv1.EventsRequest) error {
	for _, term := range terms {
		for _, f := range strings.Split(term, ",") {
			k, v, ok := strings.Cut(f, "=")
			if !ok || v == "" {
				return fmt.Errorf("filter %q: want type=TYPE, sandbox=ID|NAME or label=SELECTOR", f)
			}
			switch k {
			case "type":
				t, err := eventTypeOf(v)
				if err != nil {
					return err
				}
				req.Types = append(req.Types, t)
			case "sandbox":
				req.Sandboxes = append(req.Sandboxes, v)
			case "label":
				req.LabelSelectors = append(req.LabelSelectors, v)
			default:
				return fmt.Errorf("filter %q: unknown key %q (have type, sandbox, label)", f, k)
			}
		}
	}
	return nil
}

// eventJSON is an event as the CLI prints it (--json): the API's field
// names in camelCase, the type as its short name, numbers as numbers.
func eventJSON(e *sbxv1.Event) map[string]any {
	labels := e.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	return map[string]any{
		"seq": e.GetSeq(), "timeMs": e.GetTimeMs(), "type": eventTypeWord(e.GetType()),
		"sandboxId": e.GetSandboxId(), "sandboxName": e.GetSandboxName(), "labels": labels,
		"reason": e.GetReason(), "detail": e.GetDetail(), "exitCode": e.GetExitCode(), "signal": e.GetSignal(), "count": e.GetCount(),
	}
}

// eventLine is an event as one line of text.
func eventLine(e *sbxv1.Event) string {
	var b strings.Builder
	b.WriteString(time.UnixMilli(e.GetTimeMs()).Format("2006-01-02T15:04:05.000Z07:00"))
	b.WriteString(" " + eventTypeWord(e.GetType()))
	if e.GetSandboxId() != "" {
		b.WriteString(" " + e.GetSandboxId())
		if e.GetSandboxName() != "" {
			b.WriteString(" (" + e.GetSandboxName() + ")")
		}
	}
	if e.GetReason() != "" {
		b.WriteString(" reason=" + e.GetReason())
	}
	switch e.GetType() {
	case sbxv1.EventType_EVENT_TYPE_EXEC_ENDED:
		fmt.Fprintf(&b, " exit_code=%d", e.GetExitCode())
		if e.GetSignal() != 0 {
			fmt.Fprintf(&b, " signal=%d", e.GetSignal())
		}
	case sbxv1.EventType_EVENT_TYPE_OOM, sbxv1.EventType_EVENT_TYPE_PIDS_LIMIT:
		fmt.Fprintf(&b, " count=%d", e.GetCount())
	}
	if e.GetDetail() != "" {
		b.WriteString(": " + e.GetDetail())
	}
	return b.String()
}

func newEvents(a *app) *cobra.Command {
	var filters []string
	var since string
	var asJSON, noFollow bool
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Stream what happens to sandboxes, images and the daemon",
		Long: `Stream events: created, started, stopped, destroyed (reason user, timeout, idle,
parent, failed), failed (create, oom, crashed), exec_started, exec_ended, oom,
pids_limit, image_pulled, image_built, daemon_started. With --since, the events
the daemon still holds (the most recent 4096) from then on come first.`,
		Example: `  sbx events --filter type=oom,type=destroyed
  sbx events --filter sandbox=web --since 10m --no-follow --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &sbxv1.EventsRequest{NoFollow: noFollow}
			if err := parseEventFilters(filters, req); err != nil {
				return err
			}
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return err
				}
				req.SinceMs = t.UnixMilli()
			}
			if noFollow && req.SinceMs == 0 {
				return fmt.Errorf("--no-follow needs --since: without it there is nothing to show")
			}
			enc := json.NewEncoder(a.stdout)
			for ev, err := range a.client().Events(cmd.Context(), req) {
				if err != nil {
					return err
				}
				if asJSON {
					if err := enc.Encode(eventJSON(ev)); err != nil {
						return err
					}
					continue
				}
				fmt.Fprintln(a.stdout, eventLine(ev))
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&filters, "filter", "f", nil, "only events matching type=TYPE, sandbox=ID|NAME or label=SELECTOR (repeat, or separate with commas; same keys OR, different keys AND)")
	cmd.Flags().StringVar(&since, "since", "", "replay held events from this time: a duration back (10m) or an RFC 3339 time")
	cmd.Flags().BoolVar(&noFollow, "no-follow", false, "stop after the replay (needs --since)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line")
	return cmd
}

// statsRow is one sandbox's line of `sbx stats`.
func statsRow(e *sbxv1.SandboxStatsEntry) []string {
	c := e.GetCurrent()
	pct := func(v, limit int64) string {
		if limit <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", float64(v)*100/float64(limit))
	}
	limit := func(v int64) string {
		if v <= 0 {
			return "-"
		}
		return sandbox.FormatBytes(v)
	}
	name := e.GetSandboxName()
	if name == "" {
		name = "-"
	}
	if c == nil {
		return []string{e.GetSandboxId(), name, e.GetState(), "-", "-", "-", "-", "-", "-", strconv.FormatInt(e.GetExecs(), 10)}
	}
	return []string{
		e.GetSandboxId(), name, e.GetState(),
		fmt.Sprintf("%.1f%%", float64(c.GetCpuMillis())/10),
		sandbox.FormatBytes(c.GetMemoryBytes()) + " / " + limit(e.GetMemoryLimitBytes()),
		pct(c.GetMemoryBytes(), e.GetMemoryLimitBytes()),
		fmt.Sprintf("%d / %d", c.GetPids(), e.GetPidsLimit()),
		sandbox.FormatBytes(c.GetDiskUsedBytes()) + " / " + limit(e.GetDiskLimitBytes()),
		sandbox.FormatBytes(c.GetNetRxBytes()) + " / " + sandbox.FormatBytes(c.GetNetTxBytes()),
		strconv.FormatInt(e.GetExecs(), 10),
	}
}

func writeStatsTable(w io.Writer, list []*sbxv1.SandboxStatsEntry) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tCPU %\tMEM USAGE / LIMIT\tMEM %\tPIDS\tDISK / LIMIT\tNET RX / TX\tEXECS")
	for _, e := range list {
		fmt.Fprintln(tw, strings.Join(statsRow(e), "\t"))
	}
	return tw.Flush()
}

func sampleJSON(s *sbxv1.StatsSample) any {
	if s == nil {
		return nil
	}
	return map[string]any{"timeMs": s.GetTimeMs(), "cpuUsageNs": s.GetCpuUsageNs(), "cpuMillis": s.GetCpuMillis(),
		"memoryBytes": s.GetMemoryBytes(), "pids": s.GetPids(), "diskUsedBytes": s.GetDiskUsedBytes(),
		"netRxBytes": s.GetNetRxBytes(), "netTxBytes": s.GetNetTxBytes()}
}

// statsJSON is a stats entry as the CLI prints it (--json).
func statsJSON(e *sbxv1.SandboxStatsEntry) map[string]any {
	hist := make([]any, 0, len(e.GetHistory()))
	for _, s := range e.GetHistory() {
		hist = append(hist, sampleJSON(s))
	}
	return map[string]any{
		"sandboxId": e.GetSandboxId(), "sandboxName": e.GetSandboxName(), "state": e.GetState(), "current": sampleJSON(e.GetCurrent()),
		"memoryLimitBytes": e.GetMemoryLimitBytes(), "diskLimitBytes": e.GetDiskLimitBytes(), "pidsLimit": e.GetPidsLimit(),
		"cpuLimitMillis": e.GetCpuLimitMillis(), "oomKills": e.GetOomKills(), "pidsLimitHits": e.GetPidsLimitHits(),
		"execs": e.GetExecs(), "memoryPeakBytes": e.GetMemoryPeakBytes(), "history": hist,
	}
}

func newStats(a *app) *cobra.Command {
	var noStream, asJSON, history bool
	cmd := &cobra.Command{
		Use:   "stats [ID|NAME...]",
		Short: "Show sandboxes' resource usage (all of yours without arguments), live",
		Long: `Show CPU, memory, PIDs, disk, network and exec counts of sandboxes, refreshed at
the daemon's sampling interval (sbx serve --stats-interval, 5s by default) until
interrupted. Values are at most one interval old. --json prints once, with
--history the samples of the last 15 minutes too.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c := a.client()
			if asJSON {
				resp, err := c.Stats(ctx, history, args...)
				if err != nil {
					return err
				}
				out := make([]any, 0, len(resp.GetSandboxes()))
				for _, e := range resp.GetSandboxes() {
					out = append(out, statsJSON(e))
				}
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			if history {
				return fmt.Errorf("--history needs --json")
			}
			tty := isTerminal(a.stdout)
			for {
				resp, err := c.Stats(ctx, false, args...)
				if err != nil {
					return err
				}
				if !noStream && tty {
					fmt.Fprint(a.stdout, "\x1b[H\x1b[2J") // home, clear
				}
				if err := writeStatsTable(a.stdout, resp.GetSandboxes()); err != nil {
					return err
				}
				if noStream {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Duration(max(resp.GetIntervalMs(), 500)) * time.Millisecond):
				}
			}
		},
	}
	cmd.Flags().BoolVar(&noStream, "no-stream", false, "print once and exit")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON once (an array of sandboxes)")
	cmd.Flags().BoolVar(&history, "history", false, "with --json: include each sandbox's samples of the last 15 minutes")
	return cmd
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
