package ocibox

import (
	"fmt"
	"os"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/hostimage"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Lowers realises img as overlay lower dirs, lowest first: the image's
// unpacked layer dirs, on the built-in host image's skeleton (made once
// under imagesDir, owned by root, the host uid of box root in stored
// trees) if img.Host is set. host reports whether the host's /usr is to be
// bound read-only over the skeleton's. Layer dirs must exist; errors wrap
// errdefs.ErrInvalidArgument.
func Lowers(imagesDir string, img runtime.Image, root int) (lowers []string, host bool, err error) {
	if err := img.Validate(); err != nil {
		return nil, false, err
	}
	for _, l := range img.Layers {
		fi, err := os.Stat(l.Dir)
		if err != nil || !fi.IsDir() {
			return nil, false, fmt.Errorf("image %q layer %s: %q is not a directory: %w", img.Ref, l.Digest, l.Dir, errdefs.ErrInvalidArgument)
		}
	}
	lowers = img.LayerDirs()
	if img.Host == nil {
		return lowers, false, nil
	}
	dir, err := hostimage.Ensure(imagesDir, root, root)
	if err != nil {
		return nil, false, err
	}
	return append([]string{dir}, lowers...), true, nil
}
