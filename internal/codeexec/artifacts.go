package codeexec

import (
	"context"
	"mime"
	"path"
	"sort"
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
	sort.Slice(entries, func(i, j int) bool { return entries[i].GetPath() < entries[j].GetPath() })
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
