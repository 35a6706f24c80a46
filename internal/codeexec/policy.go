package codeexec

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// rule is a compiled PolicyRule.
type rule struct {
	*sbxv1.PolicyRule
	re *regexp.Regexp
}

func r(id, lang, pattern string, sev sbxv1.Severity, msg string) *sbxv1.PolicyRule {
	return &sbxv1.PolicyRule{Id: id, Language: lang, Pattern: pattern, Severity: sev, Message: msg}
}

// rs is r for a pattern that also sees string contents (MatchStrings).
func rs(id, lang, pattern string, sev sbxv1.Severity, msg string) *sbxv1.PolicyRule {
	p := r(id, lang, pattern, sev, msg)
	p.MatchStrings = true
	return p
}

func mod(id, lang, module string, sev sbxv1.Severity, msg string) *sbxv1.PolicyRule {
	return &sbxv1.PolicyRule{Id: id, Language: lang, Module: module, Severity: sev, Message: msg}
}

const (
	low      = sbxv1.Severity_SEVERITY_LOW
	medium   = sbxv1.Severity_SEVERITY_MEDIUM
	high     = sbxv1.Severity_SEVERITY_HIGH
	critical = sbxv1.Severity_SEVERITY_CRITICAL
)

// Presets are the built-in rule sets, by name.
var Presets = map[string][]*sbxv1.PolicyRule{
	"default": {
		r("py-os-system", "python", `\bos\.(system|popen|exec[lv]p?e?)\s*\(`, high, "runs a shell command"),
		mod("py-subprocess", "python", "subprocess", high, "starts processes"),
		mod("py-ctypes", "python", "ctypes", high, "calls native code"),
		r("py-shell-escape", "python", pyShellEscape, high, "runs a shell command (notebook line)"),
		r("py-pip-magic", "python", pyPipMagic, medium, "installs packages (%pip)"),
		r("py-eval", "python", `(^|[^.\w])(eval|exec)\s*\(`, medium, "evaluates dynamic code"),
		r("py-rmtree", "python", `\bshutil\.rmtree\s*\(`, medium, "deletes directory trees"),
		mod("js-child-process", "javascript", "child_process", high, "starts processes"),
		r("js-eval", "javascript", `(^|[^.\w])(eval|Function)\s*\(`, medium, "evaluates dynamic code"),
		mod("ts-child-process", "typescript", "child_process", high, "starts processes"),
		r("sh-rm-root", "bash", `\brm\s+(-[a-zA-Z]*[rf][a-zA-Z]*\s+)+(/|/\*|~)(\s|$)`, critical, "deletes the whole filesystem"),
		r("sh-fork-bomb", "bash", `:\s*\(\s*\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:`, critical, "fork bomb"),
		r("sh-curl-pipe", "bash", `\b(curl|wget)\b[^|\n]*\|\s*(ba)?sh\b`, high, "runs a downloaded script"),
		r("sh-dd-disk", "bash", `\bdd\b.*\bof=/dev/`, critical, "writes a raw device"),
		r("cpp-system", "cpp", `\b(system|popen|execv?[lp]?e?)\s*\(`, high, "starts processes"),
		mod("go-os-exec", "go", "os/exec", high, "starts processes"),
		mod("go-unsafe", "go", "unsafe", medium, "unsafe memory access"),
		r("java-runtime-exec", "java", `\bRuntime\.getRuntime\(\)\.exec\b|\bProcessBuilder\b`, high, "starts processes"),
		r("rb-system", "ruby", "\\b(system|exec|spawn)\\s*\\(?|`|%x", high, "runs a shell command"),
		r("r-system", "r", `\b(system2?|shell)\s*\(`, high, "runs a shell command"),
	},
	"no-network": {
		mod("py-socket", "python", "socket", high, "network access"),
		mod("py-requests", "python", "requests", high, "network access"),
		mod("py-urllib", "python", "urllib", high, "network access"),
		mod("py-http", "python", "http", high, "network access"),
		mod("js-net", "javascript", "net", high, "network access"),
		mod("js-http", "javascript", "http", high, "network access"),
		mod("js-https", "javascript", "https", high, "network access"),
		r("js-fetch", "javascript", `\bfetch\s*\(`, high, "network access"),
		r("sh-net", "bash", `\b(curl|wget|nc|ncat|ssh|scp)\b`, high, "network access"),
		mod("go-net", "go", "net", high, "network access"),
		mod("go-net-http", "go", "net/http", high, "network access"),
	},
	"no-subprocess": {
		mod("py-subprocess", "python", "subprocess", high, "starts processes"),
		r("py-os-system", "python", `\bos\.(system|popen|spawn\w*|exec\w*|fork)\s*\(`, high, "starts processes"),
		r("py-shell-escape", "python", pyShellEscape, high, "runs a shell command (notebook line)"),
		r("py-pip-magic", "python", pyPipMagic, high, "starts pip (%pip)"),
		mod("js-child-process", "javascript", "child_process", high, "starts processes"),
		mod("go-os-exec", "go", "os/exec", high, "starts processes"),
	},
	"no-filesystem": {
		// The mode is a string: these rules see string contents. One level
		// of nested parentheses in the arguments (open(os.path.join(d, f), "w")).
		rs("py-open-write", "python", `\bopen\s*\((?:[^()]|\([^()]*\))*?,\s*(?:mode\s*=\s*)?[rbfuRBFU]?['"][rbtU]*[wax+][rbtU+]*['"]`, medium, "writes files"),
		rs("py-os-open-write", "python", `\bos\.open\s*\((?:[^()]|\([^()]*\))*?\bO_(WRONLY|RDWR|CREAT|APPEND|TRUNC)\b`, medium, "writes files"),
		r("py-path-write", "python", `\.(write_text|write_bytes)\s*\(`, medium, "writes files"),
		r("py-remove", "python", `\b(os\.(remove|unlink|rmdir)|shutil\.rmtree)\s*\(`, high, "deletes files"),
		mod("js-fs", "javascript", "fs", medium, "file system access"),
		r("sh-rm", "bash", `\brm\s`, medium, "deletes files"),
	},
}

// Notebook lines python contexts and runs accept (!cmd, x = !cmd, %%bash,
// %sx, %system) and %pip, which start processes.
const (
	pyShellEscape = `^[ \t]*(?:[\w.]+[ \t]*=[ \t]*)?(?:!|%%?(?:sx|system|bash|sh|script)\b)`
	pyPipMagic    = `^[ \t]*%pip\b`
)

// compilePolicy gathers p's preset and custom rules that apply to lang.
func compilePolicy(lang string, p *sbxv1.CodePolicy) ([]rule, error) {
	var all []*sbxv1.PolicyRule
	for _, name := range p.GetPresets() {
		rs, ok := Presets[name]
		if !ok {
			return nil, fmt.Errorf("unknown policy preset %q: %w", name, errdefs.ErrInvalidArgument)
		}
		all = append(all, rs...)
	}
	all = append(all, p.GetRules()...)
	var out []rule
	for _, pr := range all {
		if pr.GetLanguage() != "" {
			l, err := lookupLanguage(pr.GetLanguage())
			if err != nil {
				return nil, fmt.Errorf("policy rule %q: %w", pr.GetId(), err)
			}
			if l.name != lang {
				continue
			}
		}
		if _, ok := sbxv1.Severity_name[int32(pr.GetSeverity())]; !ok {
			return nil, fmt.Errorf("policy rule %q: unknown severity %d (low, medium, high or critical): %w", pr.GetId(), pr.GetSeverity(), errdefs.ErrInvalidArgument)
		}
		if pr.GetMatchStrings() && pr.GetPattern() == "" {
			return nil, fmt.Errorf("policy rule %q: match_strings needs a pattern: %w", pr.GetId(), errdefs.ErrInvalidArgument)
		}
		if (pr.GetPattern() == "") == (pr.GetModule() == "") {
			return nil, fmt.Errorf("policy rule %q: give exactly one of pattern and module: %w", pr.GetId(), errdefs.ErrInvalidArgument)
		}
		ru := rule{PolicyRule: pr}
		if pr.GetPattern() != "" {
			re, err := regexp.Compile("(?m)" + pr.GetPattern())
			if err != nil {
				return nil, fmt.Errorf("policy rule %q: %v: %w", pr.GetId(), err, errdefs.ErrInvalidArgument)
			}
			ru.re = re
		}
		out = append(out, ru)
	}
	return out, nil
}

// Scan returns the findings of rules (for language lang) in code. Patterns
// see the code with comments and string literals blanked (MatchStrings
// rules: only comments); module
// rules see the names the language's import forms name.
func Scan(lang, code string, p *sbxv1.CodePolicy) ([]*sbxv1.PolicyFinding, error) {
	rules, err := compilePolicy(lang, p)
	if err != nil || len(rules) == 0 {
		return nil, err
	}
	views := scrub(lang, code)
	clean := views.clean
	var imports []importRef
	scanned := false
	var out []*sbxv1.PolicyFinding
	for _, ru := range rules {
		if ru.re != nil {
			text := clean
			if ru.GetMatchStrings() {
				text = views.withStrings
			}
			for _, m := range ru.re.FindAllStringIndex(text, -1) {
				out = append(out, finding(ru, code, m[0], strings.TrimSpace(code[m[0]:m[1]])))
			}
			continue
		}
		if !scanned {
			imports, scanned = findImports(lang, code, clean), true
		}
		for _, im := range imports {
			if im.name == ru.GetModule() || strings.HasPrefix(im.name, ru.GetModule()+".") || strings.HasPrefix(im.name, ru.GetModule()+"/") {
				out = append(out, finding(ru, code, im.at, im.name))
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Line != out[j].Line {
			return out[i].Line < out[j].Line
		}
		return out[i].Column < out[j].Column
	})
	return out, nil
}

func finding(ru rule, code string, at int, match string) *sbxv1.PolicyFinding {
	line := strings.Count(code[:at], "\n") + 1
	col := at - strings.LastIndex(code[:at], "\n")
	if len(match) > 120 {
		match = match[:120] + "..."
	}
	sev := ru.GetSeverity()
	if sev == sbxv1.Severity_SEVERITY_UNSPECIFIED {
		sev = medium
	}
	return &sbxv1.PolicyFinding{Rule: ru.GetId(), Severity: sev, Line: int32(line), Column: int32(col), Match: match, Message: ru.GetMessage()}
}

// checkPolicy scans code; in enforce mode findings at or above the threshold
// refuse the run (ErrPermissionDenied, listing them), otherwise all findings
// are returned for the result.
func checkPolicy(lang, code string, p *sbxv1.CodePolicy) ([]*sbxv1.PolicyFinding, error) {
	if p == nil {
		return nil, nil
	}
	findings, err := Scan(lang, code, p)
	if err != nil {
		return nil, err
	}
	if p.GetMode() != sbxv1.PolicyMode_POLICY_MODE_ENFORCE {
		return findings, nil
	}
	threshold := p.GetThreshold()
	if threshold == sbxv1.Severity_SEVERITY_UNSPECIFIED {
		threshold = high
	}
	var block []string
	for _, f := range findings {
		if f.GetSeverity() >= threshold {
			block = append(block, fmt.Sprintf("line %d:%d: %s [%s, %s]: %s", f.GetLine(), f.GetColumn(), f.GetRule(), SeverityName(f.GetSeverity()), f.GetMessage(), f.GetMatch()))
		}
	}
	if len(block) > 0 {
		return nil, fmt.Errorf("code policy refused to run the code (%d finding(s) at or above %s):\n  %s: %w",
			len(block), SeverityName(threshold), strings.Join(block, "\n  "), errdefs.ErrPermissionDenied)
	}
	return findings, nil
}

// SeverityName is "low", "medium", "high" or "critical".
func SeverityName(s sbxv1.Severity) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SEVERITY_"))
}
