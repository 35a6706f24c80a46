package metrics

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/sandbox"
)

var (
	sandboxesDesc = prometheus.NewDesc("sbx_sandboxes", "Sandboxes by state and runtime (as last sampled).", []string{"state", "runtime"}, nil)
	cyclesDesc    = prometheus.NewDesc("sbx_sampler_samples_total", "Samples of every sandbox taken.", nil, nil)
)

// daemonCollector reports the sandboxes by state and runtime from the
// sampler's cache.
type daemonCollector struct{ m *Metrics }

func (c *daemonCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- cyclesDesc
}

func (c *daemonCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.cfg.Sampler
	if s == nil {
		return
	}
	type key struct{ state, runtime string }
	n := map[key]int{}
	s.mu.RLock()
	for _, se := range s.boxes {
		n[key{stateWord(se.obs.State), se.obs.Runtime}]++
	}
	cycles := s.cycles
	s.mu.RUnlock()
	for k, v := range n {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(v), k.state, k.runtime)
	}
	ch <- prometheus.MustNewConstMetric(cyclesDesc, prometheus.CounterValue, float64(cycles))
}

// stateWord is a state's short name ("running").
func stateWord(s sbxv1.SandboxState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SANDBOX_STATE_"))
}

// StateWord is stateWord for the Stats API.
func StateWord(s sbxv1.SandboxState) string { return stateWord(s) }

// Per-sandbox series are written by hand in the text format (boxSeries),
// not through a registry: at 1000 sandboxes a registry's const metrics,
// consistency checks and sorting cost tens of milliseconds a scrape, the
// hand-written lines a few. They are labelled by id and name only (never by
// user labels, whose values are unbounded).
type family struct {
	name, help, typ string
	// value returns b's value and whether it has one (unmeasured boxes
	// have only their limits).
	value func(m *Metrics, b *Box) (float64, bool)
}

func always(f func(b *Box) float64) func(*Metrics, *Box) (float64, bool) {
	return func(_ *Metrics, b *Box) (float64, bool) { return f(b), true }
}

func measured(f func(b *Box) float64) func(*Metrics, *Box) (float64, bool) {
	return func(_ *Metrics, b *Box) (float64, bool) { return f(b), b.Current.TimeMs != 0 }
}

var boxFamilies = []family{
	{"sbx_sandbox_running", "1 if the sandbox is running, 0 if stopped or failed.", "gauge", always(func(b *Box) float64 {
		if b.State == sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
			return 1
		}
		return 0
	})},
	{"sbx_sandbox_cpu_seconds_total", "CPU time used by the sandbox's processes.", "counter", measured(func(b *Box) float64 { return float64(b.Current.CPUUsageNs) / 1e9 })},
	{"sbx_sandbox_memory_bytes", "Memory the sandbox uses now.", "gauge", measured(func(b *Box) float64 { return float64(b.Current.MemoryBytes) })},
	{"sbx_sandbox_memory_limit_bytes", "The sandbox's memory limit.", "gauge", always(func(b *Box) float64 { return float64(b.Resources.MemoryBytes) })},
	{"sbx_sandbox_oom_kills_total", "Processes the sandbox's memory limit killed.", "counter", measured(func(b *Box) float64 { return float64(b.OOMKills) })},
	{"sbx_sandbox_pids", "Processes (and threads) in the sandbox.", "gauge", measured(func(b *Box) float64 { return float64(b.Current.Pids) })},
	{"sbx_sandbox_pids_limit", "The sandbox's PID limit.", "gauge", always(func(b *Box) float64 { return float64(b.Resources.Pids) })},
	{"sbx_sandbox_pids_limit_hits_total", "Forks refused at the sandbox's PID limit.", "counter", measured(func(b *Box) float64 { return float64(b.PidsLimitHits) })},
	{"sbx_sandbox_disk_used_bytes", "Bytes the sandbox's writable layer uses.", "gauge", measured(func(b *Box) float64 { return float64(b.Current.DiskUsedBytes) })},
	{"sbx_sandbox_disk_limit_bytes", "The sandbox's disk limit.", "gauge", always(func(b *Box) float64 { return float64(b.Resources.DiskBytes) })},
	{"sbx_sandbox_network_receive_bytes_total", "Bytes the sandbox received.", "counter", measured(func(b *Box) float64 { return float64(b.Current.NetRxBytes) })},
	{"sbx_sandbox_network_transmit_bytes_total", "Bytes the sandbox sent.", "counter", measured(func(b *Box) float64 { return float64(b.Current.NetTxBytes) })},
	{"sbx_sandbox_network_dropped_connections_total", "Connections to the sandbox's ports the port proxy refused at its limit (sbx serve --proxy-max-conns).", "counter",
		func(m *Metrics, b *Box) (float64, bool) { _, d := m.Counts(b.ID); return float64(d), true }},
	{"sbx_sandbox_execs_total", "Commands run in the sandbox through the exec API.", "counter",
		func(m *Metrics, b *Box) (float64, bool) { e, _ := m.Counts(b.ID); return float64(e), true }},
}

// labelEscaper escapes a label value for the text format.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// writeBoxSeries writes the per-sandbox families of the sandboxes keep
// accepts (the first MaxSandboxSeries by id) in the Prometheus text format.
func (m *Metrics) writeBoxSeries(w io.Writer, keep func(o *sandbox.Observation) bool) error {
	var boxes []Box
	if s := m.cfg.Sampler; s != nil {
		boxes = s.Boxes(keep, false)
	}
	omitted := 0
	if len(boxes) > MaxSandboxSeries {
		omitted = len(boxes) - MaxSandboxSeries
		boxes = boxes[:MaxSandboxSeries]
	}
	labels := make([]string, len(boxes))
	for i := range boxes {
		labels[i] = `{id="` + labelEscaper.Replace(boxes[i].ID) + `",name="` + labelEscaper.Replace(boxes[i].Name) + `"} `
	}
	buf := make([]byte, 0, 64<<10)
	buf = fmt.Appendf(buf, "# HELP sbx_sandbox_series_omitted Sandboxes visible to this scrape left without per-sandbox series (beyond the first %d by id).\n# TYPE sbx_sandbox_series_omitted gauge\nsbx_sandbox_series_omitted %d\n", MaxSandboxSeries, omitted)
	for _, f := range boxFamilies {
		if len(boxes) == 0 {
			break
		}
		buf = append(buf, "# HELP "+f.name+" "+f.help+"\n# TYPE "+f.name+" "+f.typ+"\n"...)
		for i := range boxes {
			v, ok := f.value(m, &boxes[i])
			if !ok {
				continue
			}
			buf = append(buf, f.name...)
			buf = append(buf, labels[i]...)
			buf = strconv.AppendFloat(buf, v, 'g', -1, 64)
			buf = append(buf, '\n')
			if len(buf) > 60<<10 {
				if _, err := w.Write(buf); err != nil {
					return err
				}
				buf = buf[:0]
			}
		}
	}
	_, err := w.Write(buf)
	return err
}
