package sbx

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type ignoreVector struct {
	Name         string            `json:"name"`
	Files        map[string]string `json:"files"`
	Extra        []string          `json:"extra"`
	NoGit        bool              `json:"no_git"`
	MaxFileBytes int64             `json:"max_file_bytes"`
	Included     []string          `json:"included"`
	Skipped      []string          `json:"skipped"`
}

// TestWalkCodebaseVectors runs the vectors shared with the Python SDK.
func TestWalkCodebaseVectors(t *testing.T) {
	data, err := os.ReadFile("../testdata/codebase_ignore.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []ignoreVector `json:"cases"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) == 0 {
		t.Fatal("no vectors")
	}
	for _, tc := range doc.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			dir := t.TempDir()
			for p, content := range tc.Files {
				full := filepath.Join(dir, filepath.FromSlash(p))
				if strings.HasSuffix(p, "/") {
					if err := os.MkdirAll(full, 0o755); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			files, skipped, err := WalkCodebase(dir, UploadOptions{Ignore: tc.Extra, NoGit: tc.NoGit, MaxFileBytes: tc.MaxFileBytes})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range files {
				if !f.Info.IsDir() {
					got = append(got, f.Rel)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.Included) {
				t.Errorf("included: got %q, want %q", got, tc.Included)
			}
			var gotSkipped []string
			for _, s := range skipped {
				gotSkipped = append(gotSkipped, s.GetPath())
			}
			slices.Sort(gotSkipped)
			if !slices.Equal(gotSkipped, tc.Skipped) {
				t.Errorf("skipped: got %q, want %q", gotSkipped, tc.Skipped)
			}
		})
	}
}

func TestCompileIgnore(t *testing.T) {
	tests := []struct {
		pattern string
		path    string
		isDir   bool
		want    bool
	}{
		{"*.go", "a/b/c.go", false, true},
		{"/a.go", "x/a.go", false, false},
		{"a/", "a", false, false},
		{"a/", "a", true, true},
		{"**/x", "x", false, true},
		{"a/**", "a", true, false},
		{"a/**", "a/b/c", false, true},
		{"a/**/b", "a/b", false, true},
		{"a/**/b", "a/x/y/b", false, true},
		{"[abc", "[abc", false, true},
		{`\ `, " ", false, true},
	}
	for _, tc := range tests {
		r, ok, err := compileIgnore(tc.pattern, "")
		if err != nil || !ok {
			t.Fatalf("compileIgnore(%q): ok=%v err=%v", tc.pattern, ok, err)
		}
		m := &ignoreMatcher{rules: []ignoreRule{r}}
		if got := m.ignored(tc.path, tc.isDir); got != tc.want {
			t.Errorf("pattern %q on %q (dir %v): got %v, want %v", tc.pattern, tc.path, tc.isDir, got, tc.want)
		}
	}
}
