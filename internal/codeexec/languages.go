package codeexec

import (
	"fmt"
	"regexp"
	"strings"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// language says how to run (and maybe compile) one language with the
// sandbox image's own toolchain. Shell snippets run with the code's
// directory as working directory.
type language struct {
	name    string
	aliases []string
	// file is the source file name; javaFile may rename it.
	file string
	// tools are probed (any one suffices) to tell whether the image has the toolchain.
	tools []string
	// compile, if set, builds the program first (sh -c); its failure is a compile error.
	compile string
	// run starts the program (sh -c), unless argv is set.
	run string
	// install is a sh -c command installing libraries (appended, shell-quoted).
	install func(libs []string, src *sbxv1.LibrarySource) string
	// noInstall says why a language without install takes no libraries.
	noInstall string
	// kernel is the embedded kernel script for contexts ("" if none) and kernelCmd starts it.
	kernel, kernelCmd string
}

// nodePath is where npm installs libraries for javascript/typescript.
const nodePath = `"$HOME/.sbx/node/node_modules"`

var languages = []*language{
	{
		name: "python", aliases: []string{"py", "python3"}, file: "main.py", tools: []string{"python3"},
		install:   pipInstall,
		kernel:    "kernel.py",
		kernelCmd: `exec python3 -u -X frozen_modules=off "$SBX_KERNEL"`,
	},
	{
		name: "javascript", aliases: []string{"js", "node", "nodejs"}, file: "main.js", tools: []string{"node"},
		run:       nodeSystemCAs + `export NODE_PATH=` + nodePath + `; exec node main.js`,
		install:   npmInstall,
		kernel:    "kernel.js",
		kernelCmd: nodeSystemCAs + `export NODE_PATH=` + nodePath + `; exec node "$SBX_KERNEL"`,
	},
	{
		name: "typescript", aliases: []string{"ts"}, file: "main.ts", tools: []string{"tsx", "ts-node", "tsc"},
		run: `export NODE_PATH=` + nodePath + `; if command -v tsx >/dev/null; then exec tsx main.ts; fi; ` +
			`if command -v ts-node >/dev/null; then exec ts-node main.ts; fi; ` +
			`tsc --outDir . main.ts && exec node main.js`,
		install: npmInstall,
	},
	{
		name: "bash", aliases: []string{"sh", "shell"}, file: "main.sh", tools: []string{"bash"},
		run: `exec bash main.sh`,
	},
	{
		name: "go", aliases: []string{"golang"}, file: "main.go", tools: []string{"go"},
		compile: `[ -f go.mod ] || go mod init sbxrun >/dev/null 2>&1; go mod tidy >/dev/null 2>&1; go build -o prog .`,
		run:     `exec ./prog`,
		install: func(libs []string, src *sbxv1.LibrarySource) string {
			env := ""
			if src.GetIndexUrl() != "" {
				env = "GOPROXY=" + shQuote(src.GetIndexUrl()) + " "
			}
			return `[ -f go.mod ] || go mod init sbxrun >/dev/null 2>&1; ` + env + "go get " + shJoin(libs)
		},
	},
	{
		name: "java", file: "Main.java", tools: []string{"javac"},
		noInstall: "Java has no installer sbx can run without a build tool: put the jars in the image (a recipe step) " +
			"and compile against them through CLASSPATH in env",
		compile: `javac -d . "$SBX_SOURCE"`,
		run:     `exec java -cp . "$SBX_MAIN"`,
	},
	{
		name: "cpp", aliases: []string{"c++", "cxx"}, file: "main.cpp", tools: []string{"g++", "clang++"},
		compile: `CXX=g++; command -v g++ >/dev/null || CXX=clang++; "$CXX" -std=c++17 -O1 -o prog main.cpp`,
		run:     `exec ./prog`,
		noInstall: "C++ has no package manager sbx can run in a sandbox (apt needs root and a writable /usr): install " +
			"the -dev packages into the image (a recipe apt step) and include them",
	},
	{
		name: "ruby", aliases: []string{"rb"}, file: "main.rb", tools: []string{"ruby"},
		run: `exec ruby main.rb`,
		install: func(libs []string, src *sbxv1.LibrarySource) string {
			s := "gem install --no-document --user-install "
			if src.GetIndexUrl() != "" {
				s += "--clear-sources --source " + shQuote(src.GetIndexUrl()) + " "
			}
			return s + shJoin(libs)
		},
	},
	{
		name: "r", aliases: []string{"rscript"}, file: "main.R", tools: []string{"Rscript"},
		run: `exec Rscript main.R`,
		install: func(libs []string, src *sbxv1.LibrarySource) string {
			repo := "https://cloud.r-project.org"
			if src.GetIndexUrl() != "" {
				repo = src.GetIndexUrl()
			}
			q := make([]string, len(libs))
			for i, l := range libs {
				q[i] = fmt.Sprintf("%q", l)
			}
			// install.packages only warns when a package fails (exit 0):
			// its warnings, or a package missing from lib afterwards, fail
			// the install with a message naming them.
			expr := fmt.Sprintf(`pkgs <- c(%s); lib <- Sys.getenv("R_LIBS_USER"); dir.create(lib, recursive=TRUE, showWarnings=FALSE); `+
				`w <- character(); withCallingHandlers(install.packages(pkgs, lib=lib, repos=%q), `+
				`warning=function(c) { w <<- c(w, conditionMessage(c)); invokeRestart("muffleWarning") }); `+
				`bad <- setdiff(pkgs, rownames(installed.packages(lib.loc=lib))); `+
				`if (length(w) || length(bad)) { if (length(w)) message(paste(w, collapse="\n")); `+
				`message("failed to install: ", paste(if (length(bad)) bad else pkgs, collapse=", ")); quit(status=1) }`,
				strings.Join(q, ","), repo)
			return "Rscript -e " + shQuote(expr)
		},
	},
}

// lookupLanguage finds a language by name or alias.
func lookupLanguage(name string) (*language, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	for _, l := range languages {
		if l.name == n {
			return l, nil
		}
		for _, a := range l.aliases {
			if a == n {
				return l, nil
			}
		}
	}
	names := make([]string, len(languages))
	for i, l := range languages {
		names[i] = l.name
	}
	return nil, fmt.Errorf("unknown language %q (known: %s): %w", name, strings.Join(names, ", "), errdefs.ErrInvalidArgument)
}

// errNoInstaller refuses libraries for a language without an installer, saying why.
func errNoInstaller(l *language) error {
	why := l.noInstall
	if why == "" {
		why = "it has no package manager"
	}
	return fmt.Errorf("language %s takes no libraries: %s: %w", l.name, why, errdefs.ErrInvalidArgument)
}

// errUnavailable is the error for a language whose toolchain the image lacks.
func errUnavailable(l *language) error {
	return fmt.Errorf("language %s not available in this image (none of %s found in PATH): %w",
		l.name, strings.Join(l.tools, ", "), errdefs.ErrFailedPrecondition)
}

var javaClass = regexp.MustCompile(`(?m)^\s*public\s+(?:final\s+|abstract\s+)*class\s+([A-Za-z_]\w*)`)

// sourceFile is the file name the code is saved as (Java wants its public class's name).
func (l *language) sourceFile(code string) string {
	if l.name == "java" {
		if m := javaClass.FindStringSubmatch(code); m != nil {
			return m[1] + ".java"
		}
	}
	return l.file
}

// pipInstall installs into the user site (the host image's /usr is read-only).
func pipInstall(libs []string, src *sbxv1.LibrarySource) string {
	s := "PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --user --disable-pip-version-check --no-input --progress-bar off "
	if len(src.GetFindLinks()) > 0 {
		s += "--no-index "
		for _, d := range src.GetFindLinks() {
			s += "--find-links " + shQuote(d) + " "
		}
	}
	if src.GetIndexUrl() != "" {
		s += "--index-url " + shQuote(src.GetIndexUrl()) + " "
	}
	return s + shJoin(libs)
}

// nodeSystemCAs makes node (which ships its own CA list) also trust the
// system's CA bundle, as every other TLS client in the sandbox does (a
// registry behind a company's TLS proxy, a CA the image added).
const nodeSystemCAs = `[ -n "$NODE_EXTRA_CA_CERTS" ] || [ ! -r /etc/ssl/certs/ca-certificates.crt ] || ` +
	`export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt; `

func npmInstall(libs []string, src *sbxv1.LibrarySource) string {
	s := nodeSystemCAs + `mkdir -p "$HOME/.sbx/node" && npm install --no-audit --no-fund --no-save --prefix "$HOME/.sbx/node" `
	if src.GetIndexUrl() != "" {
		s += "--registry " + shQuote(src.GetIndexUrl()) + " "
	}
	return s + shJoin(libs)
}

var pipInstalled = regexp.MustCompile(`(?m)^Successfully installed (.+)$`)

// installedFrom reads what an installer reports installing; installers
// that say nothing parseable report the requested libraries.
func installedFrom(l *language, libs []string, output string) []string {
	if l.name == "python" {
		var out []string
		for _, m := range pipInstalled.FindAllStringSubmatch(output, -1) {
			out = append(out, strings.Fields(m[1])...)
		}
		return out
	}
	return libs
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func shJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shQuote(a)
	}
	return strings.Join(q, " ")
}
