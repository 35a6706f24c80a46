package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// codebaseFiles is the size of the generated codebases (the target).
const codebaseFiles = 10000

// genTree writes files small source-like files in 100 directories.
func genTree(dir string, files int) error {
	for i := range files {
		d := filepath.Join(dir, fmt.Sprintf("pkg%02d", i%100), fmt.Sprintf("sub%d", i%7))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		body := strings.Repeat(fmt.Sprintf("// file %d\nfunc f%d() int { return %d }\n", i, i, i*i), 1+i%8)
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d.go", i)), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func git(dir string, args ...string) error {
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=bench", "-c", "user.email=bench@example.com", "-c", "gc.auto=0"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("git %v: %v: %s", args, err, out)
	}
	return nil
}

// gitStatusLoop is the shell loop timed on the host and in a sandbox.
func gitStatusLoop(dir string, n int) string {
	return fmt.Sprintf("cd %s && for i in $(seq %d); do git status --porcelain >/dev/null || exit 1; done", dir, n)
}

// benchCodebase measures uploading a 10,000-file tree and `git status` on a
// 10,000-file repository mounted as a codebase vs on the host.
func benchCodebase(ctx context.Context, dataDir, agentPath, runtimeBin string, n int) (upload, tarx result, gitHost, gitBox time.Duration, err error) {
	if _, err := exec.LookPath("git"); err != nil {
		return upload, tarx, 0, 0, fmt.Errorf("codebase bench needs git (scripts/install-deps.sh installs it): %w", err)
	}
	src := filepath.Join(dataDir, "src")
	if err := genTree(src, codebaseFiles); err != nil {
		return upload, tarx, 0, 0, err
	}
	// The floor: GNU tar extracting the same tree on the same disk.
	treeTar := filepath.Join(dataDir, "tree.tar")
	if out, err := exec.Command("tar", "-C", src, "-cf", treeTar, ".").CombinedOutput(); err != nil {
		return upload, tarx, 0, 0, fmt.Errorf("tar -c: %v: %s", err, out)
	}
	k := 0
	tarx, err = measure(fmt.Sprintf("tar -x of the same %d files", codebaseFiles), max(n/10, 3), func() error {
		k++
		dst := filepath.Join(dataDir, fmt.Sprintf("tarx-%d", k))
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		if out, err := exec.Command("tar", "-C", dst, "-xf", treeTar).CombinedOutput(); err != nil {
			return fmt.Errorf("tar -x: %v: %s", err, out)
		}
		return nil
	}, func() {
		if k > 0 {
			_ = os.RemoveAll(filepath.Join(dataDir, fmt.Sprintf("tarx-%d", k)))
		}
	})
	if err != nil {
		return upload, tarx, 0, 0, err
	}
	_ = os.RemoveAll(filepath.Join(dataDir, fmt.Sprintf("tarx-%d", k)))
	c, stop, err := startDaemon(filepath.Join(dataDir, "data"), agentPath, runtimeBin, 0)
	if err != nil {
		return upload, tarx, 0, 0, err
	}
	defer stop()
	var ids []string
	upload, err = measure(fmt.Sprintf("codebase upload, %d files", codebaseFiles), max(n/10, 3), func() error {
		resp, err := c.CreateCodebase(ctx, src, sbx.UploadOptions{})
		if err != nil {
			return err
		}
		if got := resp.GetCodebase().GetFileCount(); got != codebaseFiles {
			return fmt.Errorf("uploaded %d files, want %d", got, codebaseFiles)
		}
		ids = append(ids, resp.GetCodebase().GetId())
		return nil
	})
	if err != nil {
		return upload, tarx, 0, 0, err
	}
	for _, id := range ids {
		_ = c.DeleteCodebase(ctx, id)
	}

	// The same tree as a git repository (objects packed, as in a clone).
	if err := git(src, "init", "-q"); err != nil {
		return upload, tarx, 0, 0, err
	}
	if err := git(src, "add", "-A"); err != nil {
		return upload, tarx, 0, 0, err
	}
	if err := git(src, "commit", "-q", "-m", "bench"); err != nil {
		return upload, tarx, 0, 0, err
	}
	if err := git(src, "repack", "-adq"); err != nil {
		return upload, tarx, 0, 0, err
	}
	resp, err := c.CreateCodebase(ctx, src, sbx.UploadOptions{Name: "bench-git"})
	if err != nil {
		return upload, tarx, 0, 0, err
	}
	defer c.DeleteCodebase(ctx, resp.GetCodebase().GetId()) //nolint:errcheck
	sb, err := c.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: "bench-git"}}, MemoryBytes: 1 << 30})
	if err != nil {
		return upload, tarx, 0, 0, err
	}
	defer sb.Destroy(ctx) //nolint:errcheck
	loops := max(n/4, 5)
	// One warm-up run each: git refreshes the index's stat data (in the
	// sandbox every file has a new inode and ctime, so the first run hashes
	// every file and writes the index into the sandbox's layer).
	if out, err := exec.Command("sh", "-c", gitStatusLoop(src, 1)).CombinedOutput(); err != nil {
		return upload, tarx, 0, 0, fmt.Errorf("git status on the host: %v: %s", err, out)
	}
	if res, err := sb.RunShell(ctx, gitStatusLoop("/workspace", 1)); err != nil || res.Code != 0 {
		return upload, tarx, 0, 0, fmt.Errorf("git status in the sandbox: %v %s", err, res.Stderr)
	}
	t0 := time.Now()
	if out, err := exec.Command("sh", "-c", gitStatusLoop(src, loops)).CombinedOutput(); err != nil {
		return upload, tarx, 0, 0, fmt.Errorf("git status on the host: %v: %s", err, out)
	}
	gitHost = time.Since(t0) / time.Duration(loops)
	t0 = time.Now()
	res, err := sb.RunShell(ctx, gitStatusLoop("/workspace", loops))
	if err != nil || res.Code != 0 {
		return upload, tarx, 0, 0, fmt.Errorf("git status in the sandbox: %v %s", err, res.Stderr)
	}
	gitBox = time.Since(t0) / time.Duration(loops)
	return upload, tarx, gitHost, gitBox, nil
}

// printCodebase prints the codebase measurements and their targets.
func printCodebase(upload, tarx result, gitHost, gitBox time.Duration) {
	fmt.Printf("%-40s %10s %10s  (target < 3 s)\n", upload.name, ms(upload.p(0.5)), ms(upload.p(0.9)))
	fmt.Printf("%-40s %10s %10s\n", tarx.name, ms(tarx.p(0.5)), ms(tarx.p(0.9)))
	fmt.Printf("codebase upload / tar -x floor    = %.2fx\n", float64(upload.p(0.5))/float64(tarx.p(0.5)))
	fmt.Printf("git status, %d-file repo, host         %s\n", codebaseFiles, ms(gitHost))
	fmt.Printf("git status, %d-file repo, codebase     %s\n", codebaseFiles, ms(gitBox))
	fmt.Printf("git status in sandbox / on host   = %.2fx  (target ≤ 2x)\n", float64(gitBox)/float64(gitHost))
}
