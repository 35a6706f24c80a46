//go:build !linux

package cli

import "errors"

// makeRaw is not implemented off Linux: `sbx exec -t` then runs with the
// terminal in its normal (cooked) mode.
func makeRaw(int) (func(), error) {
	return nil, errors.New("raw terminal mode is only implemented on Linux")
}
