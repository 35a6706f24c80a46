//sbx:hostile-tree

package codebase

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"

	"github.com/sbxdev/sbx/internal/safepath"
)

// writeTar writes a codebase tree as a tar, owners shifted back to sandbox
// ids. The tree holds what sandboxes synced, so it is walked and opened
// through safepath: symlinks are entries, never followed.
func writeTar(ctx context.Context, tree *safepath.Root, w io.Writer, shift, idRange uint32) error {
	tw := tar.NewWriter(w)
	unshift := func(id uint32) int {
		if id >= shift && id < shift+idRange {
			return int(id - shift)
		}
		return 0
	}
	err := tree.Walk(".", func(rel string, e safepath.Entry) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, _ := e.Info()
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			var err error
			if link, err = tree.Readlink(rel); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = rel
		if fi.IsDir() {
			h.Name += "/"
		}
		st := e.Stat()
		h.Uid, h.Gid = unshift(st.Uid), unshift(st.Gid)
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := tree.Open(rel)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.CopyN(tw, f, h.Size); err != nil {
			return fmt.Errorf("read %s: %w", rel, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write codebase tar: %w", err)
	}
	return tw.Close()
}
