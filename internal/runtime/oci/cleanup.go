package oci

import "errors"

// cleanupStack undoes the steps of a multi-step setup in reverse order unless
// released: Create pushes one undo per resource it makes and releases the
// stack once the box is ready.
type cleanupStack struct {
	fns []func() error
}

// add pushes an undo step.
func (c *cleanupStack) add(fn func() error) { c.fns = append(c.fns, fn) }

// release forgets every undo step (setup succeeded).
func (c *cleanupStack) release() { c.fns = nil }

// run undoes every step, last first, and returns their joined errors.
func (c *cleanupStack) run() error {
	var errs []error
	for i := len(c.fns) - 1; i >= 0; i-- {
		if err := c.fns[i](); err != nil {
			errs = append(errs, err)
		}
	}
	c.fns = nil
	return errors.Join(errs...)
}
