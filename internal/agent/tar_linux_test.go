package agent

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// uploadTar sends archive to dest in 1000-byte chunks.
func (a *testAgent) uploadTar(t *testing.T, dest string, archive []byte) (*sbxv1.UploadTarResponse, error) {
	t.Helper()
	stream := a.conn.UploadTar(testCtx(t))
	stream.Send(&sbxv1.UploadTarRequest{Msg: &sbxv1.UploadTarRequest_Header{Header: &sbxv1.UploadTarHeader{Path: dest}}})
	for len(archive) > 0 {
		n := min(len(archive), 1000)
		if err := stream.Send(&sbxv1.UploadTarRequest{Msg: &sbxv1.UploadTarRequest_Data{Data: archive[:n]}}); err != nil {
			break
		}
		archive = archive[n:]
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (a *testAgent) downloadTar(t *testing.T, path string) []byte {
	t.Helper()
	stream, err := a.conn.DownloadTar(testCtx(t), connect.NewRequest(&sbxv1.DownloadTarRequest{Path: path}))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for stream.Receive() {
		buf.Write(stream.Msg().GetData())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("download %s: %v", path, err)
	}
	return buf.Bytes()
}

// tarEntry is one entry of a test archive.
type tarEntry struct {
	hdr  tar.Header
	data string
}

func makeTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// listTree lists root's contents as "path type [content|target] mode".
func listTree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		s := rel + " "
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			s += "-> " + l
		case fi.IsDir():
			s += "dir"
		default:
			b, _ := os.ReadFile(p)
			s += "file " + string(b) + " " + fi.Mode().String()
		}
		out = append(out, s)
		return nil
	})
	sort.Strings(out)
	return out
}

func TestTarRoundTrip(t *testing.T) {
	a := newTestAgent(t)
	src := filepath.Join(a.workdir, "src")
	os.MkdirAll(filepath.Join(src, "sub/deeper"), 0o755)
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha"), 0o600)
	os.WriteFile(filepath.Join(src, "sub/b.sh"), []byte("#!/bin/sh"), 0o755)
	os.WriteFile(filepath.Join(src, "sub/deeper/c"), bytes.Repeat([]byte("c"), 200000), 0o644)
	os.Symlink("../a.txt", filepath.Join(src, "sub/link"))

	archive := a.downloadTar(t, "src")
	resp, err := a.uploadTar(t, "dst/nested", archive)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.GetFiles(), int64(4); got != want {
		t.Errorf("files: got %d, want %d", got, want)
	}
	if got, want := resp.GetBytes(), int64(5+9+200000); got != want {
		t.Errorf("bytes: got %d, want %d", got, want)
	}
	if diff := cmp.Diff(listTree(t, src), listTree(t, filepath.Join(a.workdir, "dst/nested"))); diff != "" {
		t.Errorf("tree after round trip (-want +got):\n%s", diff)
	}

	// A single file downloads as one entry named after it.
	tr := tar.NewReader(bytes.NewReader(a.downloadTar(t, "src/a.txt")))
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.Name, "a.txt"; got != want {
		t.Errorf("single file entry: got %q, want %q", got, want)
	}
}

func TestUploadTarHostile(t *testing.T) {
	reg := func(name, data string) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name}, data: data}
	}
	tests := []struct {
		name    string
		entries []tarEntry
		wantErr bool
		// setup plants files before the upload; outside is a directory
		// next to dest that must stay untouched.
		setup func(dest, outside string)
		// want is the destination's tree afterwards.
		want []string
	}{
		{
			name:    "dotdot escape",
			entries: []tarEntry{reg("../escaped", "x")},
			wantErr: true,
		},
		{
			name:    "dotdot inside name",
			entries: []tarEntry{reg("a/../../escaped", "x")},
			wantErr: true,
		},
		{
			name:    "absolute path is made relative",
			entries: []tarEntry{reg("/escaped", "x")},
			want:    []string{"escaped file x -rw-r--r--"},
		},
		{
			name: "symlink then write through it",
			entries: []tarEntry{
				{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "link", Linkname: "."}},
				reg("link/../escaped", "x"),
			},
			wantErr: true,
			want:    []string{"link -> ."},
		},
		{
			name: "symlink dir then write below it",
			entries: []tarEntry{
				{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "sub", Linkname: "inner"}},
				{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "inner/", Mode: 0o755}},
				reg("sub/escaped", "x"),
			},
			wantErr: true,
			want:    []string{"inner dir", "sub -> inner"},
		},
		{
			name: "symlink to a directory",
			entries: []tarEntry{
				{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "link", Linkname: "."}},
				reg("link/escaped", "x"),
			},
			wantErr: true,
			want:    []string{"link -> ."},
		},
		{
			name:    "planted symlink to outside directory",
			setup:   func(dest, outside string) { os.Symlink(outside, filepath.Join(dest, "out")) },
			entries: []tarEntry{reg("out/escaped", "x")},
			wantErr: true,
			want:    []string{"out -> OUTSIDE"},
		},
		{
			name:    "planted symlink to outside file is replaced",
			setup:   func(dest, outside string) { os.Symlink(filepath.Join(outside, "victim"), filepath.Join(dest, "f")) },
			entries: []tarEntry{reg("f", "new")},
			want:    []string{"f file new -rw-r--r--"},
		},
		{
			name:    "absolute symlink",
			entries: []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "etc", Linkname: "/etc"}}},
			wantErr: true,
		},
		{
			name:    "relative symlink escaping",
			entries: []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "a/up", Linkname: "../../.."}}},
			wantErr: true,
			want:    []string{"a dir"},
		},
		{
			name: "symlink replaced by file is not written through",
			entries: []tarEntry{
				{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "f", Linkname: "g"}},
				reg("f", "new"),
			},
			want: []string{"f file new -rw-r--r--"},
		},
		{
			name:    "hardlink to /etc/passwd",
			entries: []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "passwd", Linkname: "/etc/passwd"}}},
			wantErr: true,
		},
		{
			name:    "hardlink with dotdot",
			entries: []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "passwd", Linkname: "../../../../etc/passwd"}}},
			wantErr: true,
		},
		{
			name:    "hardlink inside is fine",
			entries: []tarEntry{reg("a", "data"), {hdr: tar.Header{Typeflag: tar.TypeLink, Name: "b", Linkname: "a"}}},
			want:    []string{"a file data -rw-r--r--", "b file data -rw-r--r--"},
		},
		{
			name:    "device node",
			entries: []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}}},
			wantErr: true,
		},
		{
			name: "setuid and setgid stripped",
			entries: []tarEntry{
				{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "suid", Mode: 0o4755}, data: "s"},
				{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "sgid", Mode: 0o2755}, data: "g"},
			},
			want: []string{"sgid file g -rwxr-xr-x", "suid file s -rwxr-xr-x"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newTestAgent(t)
			dest := filepath.Join(a.workdir, "dest")
			outside := filepath.Join(filepath.Dir(a.workdir), "outside")
			if err := os.MkdirAll(dest, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(outside, 0o755); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(outside, "victim"), []byte("old"), 0o644)
			if tt.setup != nil {
				tt.setup(dest, outside)
			}
			for i, w := range tt.want {
				tt.want[i] = strings.ReplaceAll(w, "OUTSIDE", outside)
			}
			_, err := a.uploadTar(t, dest, makeTar(t, tt.entries...))
			if gotErr := err != nil; gotErr != tt.wantErr {
				t.Errorf("error: got %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				if got := connect.CodeOf(err); got != connect.CodeInvalidArgument && got != connect.CodeFailedPrecondition {
					t.Errorf("code: got %v, want invalid_argument or failed_precondition", got)
				}
				if !strings.Contains(err.Error(), "dest") {
					t.Errorf("error %q does not name the destination", err)
				}
			}
			if diff := cmp.Diff(tt.want, listTree(t, dest)); diff != "" {
				t.Errorf("dest tree (-want +got):\n%s", diff)
			}
			// Nothing was written next to dest (the workdir holds only dest).
			if diff := cmp.Diff([]string{"dest"}, topLevel(t, a.workdir)); diff != "" {
				t.Errorf("outside dest (-want +got):\n%s", diff)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(a.workdir), "escaped")); err == nil {
				t.Errorf("escaped file written outside the workdir")
			}
			if diff := cmp.Diff([]string{"victim file old -rw-r--r--"}, listTree(t, outside)); diff != "" {
				t.Errorf("outside dir (-want +got):\n%s", diff)
			}
		})
	}
}

func topLevel(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
