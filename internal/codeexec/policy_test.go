package codeexec

import (
	"strconv"
	"strings"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func TestScan(t *testing.T) {
	def := &sbxv1.CodePolicy{Presets: []string{"default"}}
	nofs := &sbxv1.CodePolicy{Presets: []string{"no-filesystem"}}
	tests := []struct {
		name, lang, code string
		policy           *sbxv1.CodePolicy
		want             []string // rule@line
	}{
		{"py import", "python", "import os, subprocess as sp\n", def, []string{"py-subprocess@1"}},
		{"py from import", "python", "x = 1\nfrom subprocess import run\n", def, []string{"py-subprocess@2"}},
		{"py dotted", "python", "import subprocess.foo\n", def, []string{"py-subprocess@1"}},
		{"py prefix is not a match", "python", "import subprocessing\n", def, nil},
		{"py __import__", "python", "m = __import__('ctypes')\n", def, []string{"py-ctypes@1"}},
		{"py comment", "python", "# import subprocess\n# os.system('x')\n", def, nil},
		{"py string", "python", "s = 'os.system(1)'\nt = \"\"\"\nimport subprocess\n\"\"\"\n", def, nil},
		{"py call", "python", "import os\nos.system('ls')\n", def, []string{"py-os-system@2"}},
		{"py eval not method", "python", "df.eval('a')\nx = eval('1')\n", def, []string{"py-eval@2"}},
		{"js require", "javascript", "const cp = require('child_process')\n", def, []string{"js-child-process@1"}},
		{"js node: import", "javascript", "import { exec } from 'node:child_process'\n", def, []string{"js-child-process@1"}},
		{"js comments", "javascript", "// require('child_process')\n/* eval(x)\n*/ const s = \"eval(1)\"\n", def, nil},
		{"bash rm", "bash", "rm -rf /\n", def, []string{"sh-rm-root@1"}},
		{"bash comment", "bash", "echo hi # rm -rf /\n", def, nil},
		{"bash quoted", "bash", "echo 'rm -rf / '\n", def, nil},
		{"bash curl pipe", "bash", "curl -s https://x | sh\n", def, []string{"sh-curl-pipe@1"}},
		{"go import block", "go", "package main\nimport (\n\t\"fmt\"\n\t\"os/exec\"\n)\n", def, []string{"go-os-exec@4"}},
		{"other language rules skipped", "ruby", "import subprocess\n", def, nil},
		{"custom regex", "python", "password = 1\n", &sbxv1.CodePolicy{Rules: []*sbxv1.PolicyRule{{Id: "pw", Pattern: `password\s*=`}}}, []string{"pw@1"}},
		{"custom module any language", "python", "import numpy as np\n", &sbxv1.CodePolicy{Rules: []*sbxv1.PolicyRule{{Id: "np", Module: "numpy"}}}, []string{"np@1"}},
		{"no-network", "python", "import urllib.request\n", &sbxv1.CodePolicy{Presets: []string{"no-network"}}, []string{"py-urllib@1"}},
		{"no-filesystem open w", "python", "f = open('out.txt', 'w')\n", nofs, []string{"py-open-write@1"}},
		{"no-filesystem open mode kw and nested call", "python", "import os\nopen(os.path.join(d, 'x'), encoding='utf-8', mode=\"ab\")\n", nofs, []string{"py-open-write@2"}},
		{"no-filesystem open r+", "python", "open(p, 'r+')\n", nofs, []string{"py-open-write@1"}},
		{"no-filesystem open read", "python", "open(p)\nopen(p, 'rb')\nopen(p, encoding='ascii')\n", nofs, nil},
		{"no-filesystem open in a comment", "python", "# open(p, 'w')\nx = 1 # open(p, 'w')\n", nofs, nil},
		{"no-filesystem os.open and pathlib", "python", "os.open(p, os.O_WRONLY | os.O_CREAT)\nPath(p).write_text('x')\n", nofs, []string{"py-os-open-write@1", "py-path-write@2"}},
		{"custom match_strings", "python", "url = 'https://evil.example/x'\n", &sbxv1.CodePolicy{Rules: []*sbxv1.PolicyRule{{Id: "evil", Pattern: `evil\.example`, MatchStrings: true}}}, []string{"evil@1"}},
		{"custom pattern without match_strings misses strings", "python", "url = 'https://evil.example/x'\n", &sbxv1.CodePolicy{Rules: []*sbxv1.PolicyRule{{Id: "evil", Pattern: `evil\.example`}}}, nil},
		{"py shell escape", "python", "x = 1\n!rm -rf /tmp/x\nout = !ls\n%%bash\n", def, []string{"py-shell-escape@2", "py-shell-escape@3", "py-shell-escape@4"}},
		{"py pip magic", "python", "%pip install requests\n", &sbxv1.CodePolicy{Presets: []string{"no-subprocess"}}, []string{"py-pip-magic@1"}},
		{"py not a shell escape", "python", "if a != b:\n    x = 10 % 3\n", def, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Scan(canonical(t, tt.lang), tt.code, tt.policy)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, f := range got {
				ids = append(ids, f.GetRule()+"@"+strconv.Itoa(int(f.GetLine())))
			}
			if strings.Join(ids, ",") != strings.Join(tt.want, ",") {
				t.Errorf("got %v, want %v", ids, tt.want)
			}
		})
	}
}

func canonical(t *testing.T, lang string) string {
	l, err := lookupLanguage(lang)
	if err != nil {
		t.Fatal(err)
	}
	return l.name
}

func TestCheckPolicy(t *testing.T) {
	code := "import subprocess\nx = eval('1')\n"
	enforce := &sbxv1.CodePolicy{Presets: []string{"default"}, Mode: sbxv1.PolicyMode_POLICY_MODE_ENFORCE}
	if _, err := checkPolicy("python", code, enforce); err == nil || !strings.Contains(err.Error(), "line 1:8: py-subprocess [high") ||
		strings.Contains(err.Error(), "py-eval") {
		t.Errorf("enforce at high: got %v, want a refusal naming only py-subprocess", err)
	}
	enforce.Threshold = sbxv1.Severity_SEVERITY_MEDIUM
	if _, err := checkPolicy("python", code, enforce); err == nil || !strings.Contains(err.Error(), "py-eval") {
		t.Errorf("enforce at medium: got %v, want py-eval listed too", err)
	}
	findings, err := checkPolicy("python", code, &sbxv1.CodePolicy{Presets: []string{"default"}})
	if err != nil || len(findings) != 2 {
		t.Errorf("advisory: got %v, %v, want 2 findings and no error", findings, err)
	}
	crit := &sbxv1.CodePolicy{Mode: sbxv1.PolicyMode_POLICY_MODE_ENFORCE, Threshold: sbxv1.Severity_SEVERITY_CRITICAL,
		Rules: []*sbxv1.PolicyRule{{Id: "crit", Pattern: `eval`, Severity: sbxv1.Severity_SEVERITY_CRITICAL}}}
	if _, err := checkPolicy("python", code, crit); err == nil || !strings.Contains(err.Error(), "crit [critical") {
		t.Errorf("critical custom rule at a critical threshold: got %v, want a refusal naming crit [critical]", err)
	}
	for _, bad := range []*sbxv1.CodePolicy{
		{Presets: []string{"nope"}},
		{Rules: []*sbxv1.PolicyRule{{Id: "x", Pattern: "a", Severity: 9}}},
		{Rules: []*sbxv1.PolicyRule{{Id: "x", Module: "os", MatchStrings: true}}},
		{Rules: []*sbxv1.PolicyRule{{Id: "x", Pattern: "("}}},
		{Rules: []*sbxv1.PolicyRule{{Id: "x"}}},
	} {
		if _, err := checkPolicy("python", code, bad); err == nil {
			t.Errorf("policy %v: got no error", bad)
		}
	}
}

func TestSplitter(t *testing.T) {
	s := &splitter{token: []byte("\x1eTOK:")}
	var user []byte
	var msgs []string
	for _, chunk := range []string{"hello \x1e", "TO", "K:{\"id\":1}", "\nafter\x1eT", "x"} {
		u, m := s.feed([]byte(chunk))
		user = append(user, u...)
		msgs = append(msgs, m...)
	}
	if string(user) != "hello after\x1eTx" || len(msgs) != 1 || msgs[0] != `{"id":1}` {
		t.Errorf("got user %q msgs %q", user, msgs)
	}
}
