package codeexec

import (
	"regexp"
	"strings"
)

// syntax says how a language writes comments and string literals, as far
// as blanking them needs.
type syntax struct {
	line    []string // line comment starts
	block   [][2]string
	quotes  string // string delimiters
	triple  bool   // Python's ''' and """
	hashCmt bool   // # starts a comment only at a word start (shells)
}

var syntaxes = map[string]syntax{
	"python":     {line: []string{"#"}, quotes: `'"`, triple: true},
	"javascript": {line: []string{"//"}, block: [][2]string{{"/*", "*/"}}, quotes: "'\"`"},
	"typescript": {line: []string{"//"}, block: [][2]string{{"/*", "*/"}}, quotes: "'\"`"},
	"go":         {line: []string{"//"}, block: [][2]string{{"/*", "*/"}}, quotes: "'\"`"},
	"java":       {line: []string{"//"}, block: [][2]string{{"/*", "*/"}}, quotes: `'"`},
	"cpp":        {line: []string{"//"}, block: [][2]string{{"/*", "*/"}}, quotes: `'"`},
	"ruby":       {line: []string{"#"}, block: [][2]string{{"=begin", "=end"}}, quotes: `'"`},
	"r":          {line: []string{"#"}, quotes: `'"`},
	"bash":       {hashCmt: true, quotes: `'"`},
}

// scrubbed holds the views of a piece of code that rules match on: the
// contents of comments and string literals replaced by spaces (quotes and
// newlines kept), so offsets and line numbers still match the original.
type scrubbed struct {
	// clean has comments and string contents blanked.
	clean string
	// withStrings has only comments blanked.
	withStrings string
}

// scrub computes code's views for lang (unknown languages: all equal to code).
func scrub(lang, code string) scrubbed {
	sx, ok := syntaxes[lang]
	if !ok {
		return scrubbed{clean: code, withStrings: code}
	}
	b := []byte(code)
	w := []byte(code)
	spaceIn := func(buf []byte, from, to int) {
		for i := from; i < to && i < len(buf); i++ {
			if buf[i] != '\n' {
				buf[i] = ' '
			}
		}
	}
	comment := func(from, to int) { spaceIn(b, from, to); spaceIn(w, from, to) }
	str := func(from, to int) { spaceIn(b, from, to) }
	done := func() scrubbed { return scrubbed{clean: string(b), withStrings: string(w)} }
	i := 0
next:
	for i < len(b) {
		rest := code[i:]
		for _, bc := range sx.block {
			if strings.HasPrefix(rest, bc[0]) {
				end := strings.Index(rest[len(bc[0]):], bc[1])
				if end < 0 {
					comment(i, len(b))
					return done()
				}
				n := len(bc[0]) + end + len(bc[1])
				comment(i, i+n)
				i += n
				continue next
			}
		}
		for _, lc := range sx.line {
			if strings.HasPrefix(rest, lc) {
				n := strings.IndexByte(rest, '\n')
				if n < 0 {
					n = len(rest)
				}
				comment(i, i+n)
				i += n
				continue next
			}
		}
		c := code[i]
		if sx.hashCmt && c == '#' && (i == 0 || strings.ContainsRune(" \t\n;|&(", rune(code[i-1]))) {
			n := strings.IndexByte(rest, '\n')
			if n < 0 {
				n = len(rest)
			}
			comment(i, i+n)
			i += n
			continue
		}
		if strings.IndexByte(sx.quotes, c) >= 0 {
			if sx.triple && len(rest) >= 3 && rest[1] == c && rest[2] == c {
				end := strings.Index(rest[3:], rest[:3])
				if end < 0 {
					str(i+3, len(b))
					return done()
				}
				str(i+3, i+3+end)
				i += 3 + end + 3
				continue
			}
			j := 1
			for ; j < len(rest); j++ {
				if rest[j] == '\\' && c != '\'' || rest[j] == '\\' && lang != "bash" {
					j++
					continue
				}
				if rest[j] == c || (rest[j] == '\n' && c != '`' && lang != "bash" && lang != "ruby") {
					break
				}
			}
			str(i+1, i+j)
			i += j + 1
			continue
		}
		i++
	}
	return done()
}

// importRef is a module a piece of code imports, at a byte offset.
type importRef struct {
	name string
	at   int
}

// Import forms per language, matched on the blanked code. Group 1 is the
// module name, or the (blanked) inside of the quotes naming it, whose text
// is then read from the original code.
var importForms = map[string][]*regexp.Regexp{
	"python": {
		regexp.MustCompile(`(?m)^[ \t]*import[ \t]+([\w.]+(?:[ \t]*(?:as[ \t]+\w+)?[ \t]*,[ \t]*[\w.]+)*)`),
		regexp.MustCompile(`(?m)^[ \t]*from[ \t]+([\w.]+)[ \t]+import\b`),
		regexp.MustCompile(`\b__import__\s*\(\s*['"]([^'"]*)['"]`),
		regexp.MustCompile(`\bimport_module\s*\(\s*['"]([^'"]*)['"]`),
	},
	"javascript": jsImports,
	"typescript": jsImports,
	"go": {
		regexp.MustCompile(`(?m)^\s*import\s+(?:[\w.]+\s+)?"([^"]*)"`),
		regexp.MustCompile(`(?m)^\s*(?:[\w.]+\s+)?"([^"]*)"\s*$`), // inside import ( ... ) blocks
	},
	"java": {regexp.MustCompile(`(?m)^\s*import\s+(?:static\s+)?([\w.]+)`)},
	"cpp":  {regexp.MustCompile(`(?m)^\s*#\s*include\s*[<"]([^>"]*)[>"]`)},
	"ruby": {regexp.MustCompile(`\brequire(?:_relative)?\s*\(?\s*['"]([^'"]*)['"]`)},
	"r":    {regexp.MustCompile(`\b(?:library|require|requireNamespace)\s*\(\s*['"]?([\w.]*)['"]?`)},
	"bash": {regexp.MustCompile(`(?m)(?:^|[;&|(]|\b(?:then|do|else)\b)\s*([\w./-]+)`)},
}

var jsImports = []*regexp.Regexp{
	regexp.MustCompile(`\brequire\s*\(\s*['"` + "`" + `]([^'"` + "`" + `]*)['"` + "`" + `]`),
	regexp.MustCompile(`\bimport\s*\(\s*['"]([^'"]*)['"]`),
	regexp.MustCompile(`(?m)^\s*import\s+(?:[^'"]*?\s+from\s+)?['"]([^'"]*)['"]`),
	regexp.MustCompile(`(?m)^\s*export\s+[^'"]*?\s+from\s+['"]([^'"]*)['"]`),
}

func findImports(lang, code, clean string) []importRef {
	var out []importRef
	for _, re := range importForms[lang] {
		for _, m := range re.FindAllStringSubmatchIndex(clean, -1) {
			text := code[m[2]:m[3]] // the original text: string contents are blanked in clean
			if lang == "go" && !insideGoImports(clean, m[0]) && !strings.Contains(clean[m[0]:m[1]], "import") {
				continue
			}
			for _, part := range strings.Split(text, ",") {
				name := strings.TrimSpace(part)
				if f := strings.Fields(name); len(f) > 0 {
					name = f[0]
				}
				name = strings.TrimPrefix(name, "node:")
				if name != "" {
					out = append(out, importRef{name: name, at: m[2]})
				}
			}
		}
	}
	return out
}

// insideGoImports reports whether offset at is inside an import ( ... ) block.
func insideGoImports(clean string, at int) bool {
	open := strings.LastIndex(clean[:at], "import (")
	if open < 0 {
		return false
	}
	return !strings.Contains(clean[open:at], ")")
}
