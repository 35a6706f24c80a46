package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/sandbox"
)

var (
	sandboxesDesc = prometheus.NewDesc("sbx_sandboxes", "Sandboxes by state and runtime (as last sampled).", []string{"state", "runtime"}, nil)
	omittedDesc   = prometheus.NewDesc("sbx_sandbox_series_omitted",
		"Sandboxes visible to this scrape left without per-sandbox series (beyond the first 1000 by id).", nil, nil)
	cyclesDesc = prometheus.NewDesc("sbx_sampler_samples_total", "Samples of every sandbox taken.", nil, nil)
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

// Per-sandbox series: labelled by id and name only (never by user labels,
// whose values are unbounded).
var boxLabels = []string{"id", "name"}

func boxDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, boxLabels, nil)
}

var (
	cpuDesc       = boxDesc("sbx_sandbox_cpu_seconds_total", "CPU time used by the sandbox's processes.")
	memDesc       = boxDesc("sbx_sandbox_memory_bytes", "Memory the sandbox uses now.")
	memLimitDesc  = boxDesc("sbx_sandbox_memory_limit_bytes", "The sandbox's memory limit.")
	oomDesc       = boxDesc("sbx_sandbox_oom_kills_total", "Processes the sandbox's memory limit killed.")
	pidsDesc      = boxDesc("sbx_sandbox_pids", "Processes (and threads) in the sandbox.")
	pidsLimitDesc = boxDesc("sbx_sandbox_pids_limit", "The sandbox's PID limit.")
	pidsHitsDesc  = boxDesc("sbx_sandbox_pids_limit_hits_total", "Forks refused at the sandbox's PID limit.")
	diskDesc      = boxDesc("sbx_sandbox_disk_used_bytes", "Bytes the sandbox's writable layer uses.")
	diskLimitDesc = boxDesc("sbx_sandbox_disk_limit_bytes", "The sandbox's disk limit.")
	rxDesc        = boxDesc("sbx_sandbox_network_receive_bytes_total", "Bytes the sandbox received.")
	txDesc        = boxDesc("sbx_sandbox_network_transmit_bytes_total", "Bytes the sandbox sent.")
	execsDesc     = boxDesc("sbx_sandbox_execs_total", "Commands run in the sandbox through the exec API.")
	droppedDesc   = boxDesc("sbx_sandbox_network_dropped_connections_total", "Connections to the sandbox's ports the port proxy refused at its limit (sbx serve --proxy-max-conns).")
	upDesc        = boxDesc("sbx_sandbox_running", "1 if the sandbox is running, 0 if stopped or failed.")
)

// boxCollector reports the per-sandbox series of the sandboxes keep
// accepts, from the sampler's cache.
type boxCollector struct {
	m    *Metrics
	keep func(o *sandbox.Observation) bool
}

func (c *boxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{cpuDesc, memDesc, memLimitDesc, oomDesc, pidsDesc, pidsLimitDesc, pidsHitsDesc,
		diskDesc, diskLimitDesc, rxDesc, txDesc, execsDesc, droppedDesc, upDesc, omittedDesc} {
		ch <- d
	}
}

func (c *boxCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.cfg.Sampler
	if s == nil {
		return
	}
	boxes := s.Boxes(c.keep, false)
	omitted := 0
	if len(boxes) > MaxSandboxSeries {
		omitted = len(boxes) - MaxSandboxSeries
		boxes = boxes[:MaxSandboxSeries]
	}
	ch <- prometheus.MustNewConstMetric(omittedDesc, prometheus.GaugeValue, float64(omitted))
	gauge := func(d *prometheus.Desc, v int64, b *Box) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), b.ID, b.Name)
	}
	counter := func(d *prometheus.Desc, v float64, b *Box) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, b.ID, b.Name)
	}
	for i := range boxes {
		b := &boxes[i]
		up := int64(0)
		if b.State == sbxv1.SandboxState_SANDBOX_STATE_RUNNING {
			up = 1
		}
		gauge(upDesc, up, b)
		gauge(memLimitDesc, b.Resources.MemoryBytes, b)
		gauge(pidsLimitDesc, b.Resources.Pids, b)
		gauge(diskLimitDesc, b.Resources.DiskBytes, b)
		execs, dropped := c.m.Counts(b.ID)
		counter(execsDesc, float64(execs), b)
		counter(droppedDesc, float64(dropped), b)
		if b.Current.TimeMs == 0 {
			continue // never measured
		}
		counter(cpuDesc, float64(b.Current.CPUUsageNs)/1e9, b)
		gauge(memDesc, b.Current.MemoryBytes, b)
		counter(oomDesc, float64(b.OOMKills), b)
		gauge(pidsDesc, b.Current.Pids, b)
		counter(pidsHitsDesc, float64(b.PidsLimitHits), b)
		gauge(diskDesc, b.Current.DiskUsedBytes, b)
		counter(rxDesc, float64(b.Current.NetRxBytes), b)
		counter(txDesc, float64(b.Current.NetTxBytes), b)
	}
}
