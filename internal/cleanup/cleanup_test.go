package cleanup

import (
	"errors"
	"slices"
	"testing"
)

func TestStack(t *testing.T) {
	errA, errB := errors.New("a failed"), errors.New("b failed")
	for _, tc := range []struct {
		name     string
		release  bool
		wantRan  []string
		wantErrs []error
	}{
		{name: "run", wantRan: []string{"c", "b", "a"}, wantErrs: []error{errA, errB}},
		{name: "released", release: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ran []string
			var s Stack
			s.Add(func() error { ran = append(ran, "a"); return errA })
			s.Add(func() error { ran = append(ran, "b"); return errB })
			s.Add(func() error { ran = append(ran, "c"); return nil })
			if tc.release {
				s.Release()
			}
			err := s.Run()
			if !slices.Equal(ran, tc.wantRan) {
				t.Errorf("ran %v, want %v (last first)", ran, tc.wantRan)
			}
			for _, want := range tc.wantErrs {
				if !errors.Is(err, want) {
					t.Errorf("Run() = %v, want it to wrap %v", err, want)
				}
			}
			if len(tc.wantErrs) == 0 && err != nil {
				t.Errorf("Run() = %v, want nil", err)
			}
			if err := s.Run(); err != nil || len(ran) != len(tc.wantRan) {
				t.Errorf("second Run() = %v and ran %v: want nothing run again", err, ran)
			}
		})
	}
}
