package builder

import (
	"archive/tar"
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// ctxTar makes a context tar: "name/" is a directory, "->target" a
// symlink, anything else file content.
func ctxTar(t testing.TB, ents ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e[0], Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e[1]))}
		body := e[1]
		switch {
		case strings.HasSuffix(e[0], "/"):
			h.Typeflag, h.Mode, h.Size, body = tar.TypeDir, 0o755, 0, ""
		case strings.HasPrefix(e[1], "->"):
			h.Typeflag, h.Linkname, h.Size, body = tar.TypeSymlink, e[1][2:], 0, ""
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	return buf.Bytes()
}

// names lists a copy tar's entries as "name" or "name -> link".
func names(t testing.TB, data []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		n := h.Name
		if h.Linkname != "" {
			n += " -> " + h.Linkname
		}
		if h.Uid != 0 || h.Gid != 0 {
			n += " (not root's)"
		}
		out = append(out, n)
	}
	return out
}

// stepText is a step as "kind arg": copies as "copy DEST [names...]".
func stepText(t testing.TB, s *sbxv1.RecipeStep) string {
	if c := s.GetCopy(); c != nil {
		return "copy " + c.GetDest() + " " + strings.Join(names(t, c.GetTar()), ",")
	}
	return describe(s)
}

func TestDockerfileRecipe(t *testing.T) {
	context := ctxTar(t,
		[2]string{"app/", ""}, [2]string{"app/main.py", "print(1)"}, [2]string{"app/lib/util.py", "x"},
		[2]string{"app/link", "->main.py"}, [2]string{"README.md", "r"}, [2]string{"a.txt", "a"}, [2]string{"b.txt", "b"},
		[2]string{"./dotted.sh", "s"},
	)
	for _, tc := range []struct {
		name string
		src  string
		args map[string]string
		from string
		want []string
	}{
		{
			name: "common subset",
			src: `# syntax=docker/dockerfile:1
FROM debian:bookworm AS base
ARG VERSION=1.0
ENV APP_HOME=/srv/app \
    MODE="prod mode"
WORKDIR $APP_HOME
COPY app/ ./
RUN echo "$VERSION" > /v && \
    # a comment inside a continuation
    true
USER 1000:1000
LABEL org.example=1
EXPOSE 8080
ENTRYPOINT ["python3", "main.py"]
CMD --verbose
`,
			from: "debian:bookworm",
			want: []string{
				"ENV APP_HOME=/srv/app MODE=prod mode",
				"WORKDIR /srv/app",
				"copy /srv/app lib/,lib/util.py,link -> main.py,main.py",
				`RUN export VERSION='1.0'; echo "$VERSION" > /v && true`,
				"USER 1000:1000",
				`ENTRYPOINT ["python3","main.py"]`,
				`CMD ["/bin/sh","-c","--verbose"]`,
			},
		},
		{
			name: "build args and global ARG in FROM",
			src:  "ARG BASE=alpine:3\nFROM ${BASE}\nARG BASE\nARG N\nRUN echo $BASE $N\n",
			args: map[string]string{"N": "7"},
			from: "alpine:3",
			want: []string{"RUN export BASE='alpine:3'; export N='7'; echo $BASE $N"},
		},
		{
			name: "copy file to a new name, globs, several sources",
			src:  "FROM x\nCOPY a.txt /etc/renamed.txt\nCOPY *.txt /txt/\nCOPY README.md dotted.sh /docs/\nADD app/main.py /opt/\n",
			from: "x",
			want: []string{"copy /etc renamed.txt", "copy /txt a.txt,b.txt", "copy /docs README.md,dotted.sh", "copy /opt main.py"},
		},
		{
			name: "<< that is no heredoc",
			src:  "FROM x\nRUN python3 -c 'print(1<<3, \"a<<b\")'\n",
			from: "x",
			want: []string{`RUN python3 -c 'print(1<<3, "a<<b")'`},
		},
		{
			name: "exec-form RUN and relative WORKDIR",
			src:  "FROM x\nWORKDIR /a\nWORKDIR b\nRUN [\"echo\", \"it's\"]\n",
			from: "x",
			want: []string{"WORKDIR /a", "WORKDIR /a/b", `RUN exec 'echo' 'it'\''s'`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := DockerfileRecipe(tc.src, context, tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if r.GetFrom() != tc.from {
				t.Errorf("from: got %q, want %q", r.GetFrom(), tc.from)
			}
			var got []string
			for _, s := range r.GetSteps() {
				got = append(got, stepText(t, s))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			if err := validate(r); err != nil {
				t.Errorf("the recipe does not validate: %v", err)
			}
		})
	}
}

// Every unsupported or hostile input fails with InvalidArgument naming
// what was wrong (and the line, for instructions).
func TestDockerfileRefusals(t *testing.T) {
	context := ctxTar(t, [2]string{"ok.txt", "x"}, [2]string{"link", "->/etc"}, [2]string{"dirlink", "->sub"},
		[2]string{"sub/f", "f"}, [2]string{"data.tar.gz", "gz"})
	for _, tc := range []struct {
		name, src string
		context   []byte
		want      string
	}{
		{"no FROM", "RUN true", context, "line 1: RUN before FROM"},
		{"multi-stage", "FROM a\nFROM b", context, "line 2: a second FROM: multi-stage builds are not supported"},
		{"copy --from", "FROM a\nCOPY --from=build /x /y", context, "line 2: COPY --from is not supported"},
		{"copy --chown", "FROM a\nCOPY --chown=1:1 ok.txt /y", context, "line 2: COPY --chown is not supported"},
		{"run --mount", "FROM a\nRUN --mount=type=cache,target=/c true", context, "line 2: RUN --mount is not supported"},
		{"healthcheck", "FROM a\n\nHEALTHCHECK CMD true", context, "line 3: HEALTHCHECK is not supported"},
		{"unknown", "FROM a\nFROBNICATE x", context, `line 2: unknown instruction "FROBNICATE"`},
		{"heredoc", "FROM a\nRUN <<EOF\necho hi\nEOF", context, "line 2: heredocs (<<EOF) are not supported"},
		{"escape directive", "# escape=`\nFROM a", context, "line 1: escape=`"},
		{"add url", "FROM a\nADD https://example.com/x /x", context, "line 2: ADD \"https://example.com/x\": only local files"},
		{"add archive", "FROM a\nADD data.tar.gz /x/", context, "ADD would unpack this archive"},
		{"absolute source", "FROM a\nCOPY /etc/passwd /x", context, `source "/etc/passwd": absolute path`},
		{"dotdot source", "FROM a\nCOPY ../secret /x", context, `source "../secret": ".." component`},
		{"through a symlink", "FROM a\nCOPY link/passwd /x", context, `goes through the symlink "link"`},
		{"through a dir symlink", "FROM a\nCOPY dirlink/f /x", context, `goes through the symlink "dirlink"`},
		{"missing source", "FROM a\nCOPY nope /x", context, `source "nope": not in the build context`},
		{"several sources, file dest", "FROM a\nCOPY ok.txt sub /x", context, "the destination must end with /"},
		{"scratch", "FROM scratch", context, "FROM scratch is not supported"},
		{"context with absolute name", "FROM a", ctxTar(t, [2]string{"/etc/x", "x"}), `entry "/etc/x": absolute path`},
		{"context with dotdot", "FROM a", ctxTar(t, [2]string{"a/../../x", "x"}), `entry "a/../../x": ".." component`},
		{"context not a tar", "FROM a", []byte(strings.Repeat("junk", 200)), "build context: not a tar"},
		{"context too big", "FROM a", make([]byte, MaxContextBytes+1), "more than 50331648"},
		{"copies amplify the context", "FROM a\n" + strings.Repeat("COPY ok.txt /x/\n", 990), context, "COPY and ADD steps copy more than"},
		{"unterminated quote", "FROM a\nENV A=\"x", context, "line 2: ENV: unterminated \" quote"},
		{"bad substitution", "FROM a\nENV A=${B:?x}", context, "bad substitution"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DockerfileRecipe(tc.src, tc.context, nil)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want InvalidArgument containing %q", err, tc.want)
			}
		})
	}
	if _, err := DockerfileRecipe("FROM a", nil, map[string]string{"1bad": "x"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad build arg name: got %v, want InvalidArgument", err)
	}
}

// The largest Dockerfiles parse in linear time: one instruction continued
// over half a million lines, and a thousand instructions.
func TestDockerfileLarge(t *testing.T) {
	for name, src := range map[string]string{
		"continued": "FROM a\nRUN true" + strings.Repeat(" \\\n&&", (maxDockerfileBytes-20)/5) + " true\n",
		"many":      "FROM a\n" + strings.Repeat("ENV A=1\n", maxInstructions-1),
	} {
		start := time.Now()
		if _, err := DockerfileRecipe(src, nil, nil); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: %d bytes took %v", name, len(src), d)
		}
	}
}
