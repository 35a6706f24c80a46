package codeexec

import (
	"context"
	"mime"
	"path"
	"slices"
	"strings"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
)

// collectArtifacts lists and reads the regular files under dir (a run's
// outputs directory). A missing dir means no artifacts. Files past the
// count or byte limits are listed with their size but no content. found
// says whether dir exists.
func collectArtifacts(ctx context.Context, conn *agentconn.Conn, dir string) (arts []*sbxv1.Artifact, found bool) {
	resp, err := conn.ListDir(ctx, connect.NewRequest(&sbxv1.ListDirRequest{Path: dir, Recursive: true}))
	if err != nil {
		return nil, false
	}
	entries := resp.Msg.GetEntries()
	slices.SortFunc(entries, func(a, b *sbxv1.FileInfo) int { return naturalCompare(a.GetPath(), b.GetPath()) })
	var out []*sbxv1.Artifact
	budget := int64(maxArtifactBytes)
	for _, e := range entries {
		if e.GetType() != sbxv1.FileType_FILE_TYPE_FILE || len(out) >= maxArtifacts {
			continue
		}
		name := strings.TrimPrefix(strings.TrimPrefix(e.GetPath(), dir), "/")
		a := &sbxv1.Artifact{Name: name, Size: e.GetSize()}
		a.Format, a.Mime = formatOf(name)
		if e.GetSize() <= budget {
			if b, err := readFile(ctx, conn, e.GetPath()); err == nil {
				a.Content, a.Size = b, int64(len(b))
				budget -= a.Size
			}
		}
		out = append(out, a)
	}
	return out, true
}

// naturalCompare orders paths as `ls -v` does: runs of digits compare by
// their value, so figure-2.png comes before figure-10.png (the notebook
// helpers number figures figure-N.png and plotly-N.html in the order they
// were shown; text order put figure-10 before figure-2). Equal values
// with different digits (01 and 1) fall back to text order.
func naturalCompare(a, b string) int {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if isDigit(a[i]) && isDigit(b[j]) {
			si, sj := i, j
			for i < len(a) && isDigit(a[i]) {
				i++
			}
			for j < len(b) && isDigit(b[j]) {
				j++
			}
			na := strings.TrimLeft(a[si:i], "0")
			nb := strings.TrimLeft(b[sj:j], "0")
			if c := cmpInt(len(na), len(nb)); c != 0 {
				return c // more significant digits: larger
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			continue
		}
		if a[i] != b[j] {
			return cmpInt(int(a[i]), int(b[j]))
		}
		i++
		j++
	}
	if c := cmpInt(len(a)-i, len(b)-j); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func cmpInt(x, y int) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// formatOf returns a file's format (its extension) and MIME type.
func formatOf(name string) (format, mimeType string) {
	ext := strings.ToLower(path.Ext(name))
	format = strings.TrimPrefix(ext, ".")
	if strings.HasSuffix(strings.ToLower(name), ".plotly.json") {
		// A plotly figure, as Jupyter's and E2B's display data carry it.
		return format, "application/vnd.plotly.v1+json"
	}
	switch ext {
	case ".png":
		return format, "image/png"
	case ".svg":
		return format, "image/svg+xml"
	case ".html", ".htm":
		return format, "text/html"
	case ".json":
		return format, "application/json"
	case ".csv":
		return format, "text/csv"
	case ".txt", ".log", ".md":
		return format, "text/plain"
	}
	if t := mime.TypeByExtension(ext); t != "" {
		return format, t
	}
	return format, "application/octet-stream"
}
