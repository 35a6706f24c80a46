package runtime

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// ErrHandleVersion is wrapped (with errdefs.ErrFailedPrecondition) by
// drivers given a handle whose Data has a version newer than they know: a
// newer daemon made the box and this one must not guess what its handle
// means. Recover leaves such a box alone (the manager keeps its record and
// tells the driver's Cleanup to keep it), so a daemon rolled back and
// forward again finds it as it was.
var ErrHandleVersion = errors.New("driver handle from a newer sbx")

// Versioned handle data: a driver's Handle.Data is a JSON object whose "v"
// field says which format of the driver's own the rest is in. A handle
// with no "v" (or no Data) is version 0: what drivers wrote before handles
// carried versions. A driver bumps its version whenever what it persists
// changes meaning, keeps reading every older version, and refuses newer
// ones with ErrHandleVersion (DecodeHandle does all three).

// handleVersion is the one field every versioned Data has.
type handleVersion struct {
	V int `json:"v"`
}

// DecodeHandle reads h.Data as the driver's data type T and returns it
// with the data's version: 0 for no Data or no "v". A version above
// current is refused with an error wrapping ErrHandleVersion and
// errdefs.ErrFailedPrecondition; undecodable data wraps
// errdefs.ErrInvalidArgument. On error the returned T is zero. The driver
// converts an older version's fields itself.
func DecodeHandle[T any](h Handle, current int) (T, int, error) {
	var zero, v T
	if len(h.Data) == 0 {
		return zero, 0, nil
	}
	var hv handleVersion
	if err := json.Unmarshal(h.Data, &hv); err != nil {
		return zero, 0, fmt.Errorf("decode %s handle of box %s: %w: %w", h.Driver, h.ID, err, errdefs.ErrInvalidArgument)
	}
	if hv.V < 0 || hv.V > current {
		return zero, hv.V, fmt.Errorf("%s handle of box %s has version %d, this daemon knows up to %d: %w: %w",
			h.Driver, h.ID, hv.V, current, ErrHandleVersion, errdefs.ErrFailedPrecondition)
	}
	if err := json.Unmarshal(h.Data, &v); err != nil {
		return zero, hv.V, fmt.Errorf("decode %s handle of box %s (version %d): %w: %w", h.Driver, h.ID, hv.V, err, errdefs.ErrInvalidArgument)
	}
	return v, hv.V, nil
}
