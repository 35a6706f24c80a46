package codeexec

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// TestRInstallFailureFails runs the R installer command with the host's
// Rscript against an empty local repository: install.packages only warns
// there, and the command must still fail naming the package.
func TestRInstallFailureFails(t *testing.T) {
	if _, err := exec.LookPath("Rscript"); err != nil {
		t.Skip("no Rscript")
	}
	l, err := lookupLanguage("r")
	if err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	if err := os.MkdirAll(repo+"/src/contrib", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(repo+"/src/contrib/PACKAGES", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", l.install([]string{"sbxnosuchpkg"}, &sbxv1.LibrarySource{IndexUrl: "file://" + repo}))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "R_LIBS_USER=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "failed to install: sbxnosuchpkg") {
		t.Errorf("got %v, output %q, want a failed exit naming sbxnosuchpkg", err, out)
	}
}

func TestNoInstallerSaysWhy(t *testing.T) {
	tests := []struct{ lang, want string }{
		{"cpp", "language cpp takes no libraries: C++ has no package manager"},
		{"java", "language java takes no libraries: Java has no installer"},
		{"bash", "language bash takes no libraries: it has no package manager"},
	}
	for _, tt := range tests {
		l, err := lookupLanguage(tt.lang)
		if err != nil {
			t.Fatal(err)
		}
		if l.install != nil {
			t.Fatalf("%s has an installer", tt.lang)
		}
		err = errNoInstaller(l)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want InvalidArgument starting %q", tt.lang, err, tt.want)
		}
	}
}
