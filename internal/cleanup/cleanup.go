// Package cleanup rolls back multi-step setups (gVisor's pkg/cleanup): a
// Stack collects one undo per resource made and runs them, last first,
// unless released once the whole setup succeeded. It imports nothing from
// sbx; the runtime drivers' Create use it.
package cleanup

import "errors"

// Stack undoes the steps of a multi-step setup in reverse order unless
// released. The zero value is ready to use; it is not safe for concurrent
// use.
type Stack struct {
	fns []func() error
}

// Add pushes an undo step.
func (s *Stack) Add(fn func() error) { s.fns = append(s.fns, fn) }

// Release forgets every undo step (the setup succeeded).
func (s *Stack) Release() { s.fns = nil }

// Run undoes every step, last first, even when some fail, and returns
// their joined errors. The stack is empty afterwards.
func (s *Stack) Run() error {
	var errs []error
	for i := len(s.fns) - 1; i >= 0; i-- {
		if err := s.fns[i](); err != nil {
			errs = append(errs, err)
		}
	}
	s.fns = nil
	return errors.Join(errs...)
}
