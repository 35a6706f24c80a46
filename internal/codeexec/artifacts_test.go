package codeexec

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Artifacts come in natural order: the notebook helpers' figure-N.png in
// the order they were shown (text order put figure-10 before figure-2).
func TestNaturalCompare(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []string
		want []string
	}{
		{"numbered figures", []string{"/o/figure-10.png", "/o/figure-2.png", "/o/figure-1.png"},
			[]string{"/o/figure-1.png", "/o/figure-2.png", "/o/figure-10.png"}},
		{"plot2 before plot10", []string{"plot10", "plot2", "plot1a", "plot"}, []string{"plot", "plot1a", "plot2", "plot10"}},
		{"leading zeros tie-break by text", []string{"a1", "a01", "a001", "a2"}, []string{"a001", "a01", "a1", "a2"}},
		{"directories", []string{"/o/run10/x", "/o/run9/y", "/o/run9/x"}, []string{"/o/run9/x", "/o/run9/y", "/o/run10/x"}},
		{"long numbers", []string{"n18446744073709551616", "n9"}, []string{"n9", "n18446744073709551616"}},
		{"no digits", []string{"b", "a", "ab"}, []string{"a", "ab", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := slices.Clone(tc.in)
			slices.SortFunc(got, naturalCompare)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("order (-want +got):\n%s", d)
			}
		})
	}
}
