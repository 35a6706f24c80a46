package builder

import (
	"testing"
)

// FuzzDockerfile feeds arbitrary Dockerfiles (with a small fixed context)
// to the parser: it must return a recipe that validates or an error, never
// panic or hang; a recipe has a base, and every COPY it makes is a tar of
// relative names.
func FuzzDockerfile(f *testing.F) {
	context := ctxTar(f, [2]string{"app/", ""}, [2]string{"app/main.py", "print(1)"}, [2]string{"link", "->/etc"},
		[2]string{"a.txt", "a"})
	for _, s := range []string{
		"FROM debian:bookworm\nRUN echo hi\n",
		"ARG B=x\nFROM $B\nENV A=1 B=\"two words\"\nWORKDIR /srv\nCOPY app/ ./\nUSER 1000\nCMD [\"python3\",\"main.py\"]\n",
		"FROM a\nCOPY *.txt link /x/\n",
		"FROM a\nENV X=${Y:-d}${Z:+e} \\\n  W=\\$lit\n",
		"# escape=\\\nFROM a\nADD a.txt /b\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		r, err := DockerfileRecipe(src, context, map[string]string{"B": "base"})
		if err != nil {
			return
		}
		if r.GetFrom() == "" {
			t.Fatalf("recipe without a base from %q", src)
		}
		for _, s := range r.GetSteps() {
			if c := s.GetCopy(); c != nil {
				for _, n := range names(t, c.GetTar()) {
					if len(n) > 0 && n[0] == '/' {
						t.Fatalf("copy tar entry %q is absolute", n)
					}
				}
			}
		}
	})
}
