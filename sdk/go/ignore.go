package sbx

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strings"
)

// Ignore rules for codebase uploads follow gitignore(5):
//
//   - blank lines and lines starting with "#" are skipped ("\#" is a literal
//     "#"); trailing spaces are dropped unless escaped with "\";
//   - "!" re-includes what an earlier pattern excluded ("\!" is a literal
//     "!"); a file inside an excluded directory cannot be re-included, since
//     excluded directories are not walked;
//   - a pattern ending in "/" matches directories only;
//   - a pattern with a "/" at its start or middle is anchored to the
//     directory of the file it comes from; otherwise it matches a name at any
//     depth below that directory;
//   - "*" matches anything but "/", "?" one character but "/", "[a-z]" and
//     "[!a-z]" a class; "**/" at the start matches in every directory, "/**"
//     at the end everything inside, "/**/" zero or more directories.
//
// Rules come from .gitignore and .sandboxignore files in every directory of
// the tree (a deeper file wins over a shallower one; in one directory
// .sandboxignore wins over .gitignore) and from extra patterns, which are
// anchored at the root and win over every file. The last matching rule
// decides. An ignore file is read only if it is a regular file of the tree
// of at most MaxIgnoreFileBytes (readIgnoreFile): a symlink, a FIFO or a
// device fails the walk naming it.

// ignoreRule is one compiled pattern.
type ignoreRule struct {
	base    string // directory (relative to the tree root, "" for the root) the rule applies below
	re      *regexp.Regexp
	negate  bool
	dirOnly bool
}

// parseIgnore compiles the patterns of one ignore file whose directory is base.
func parseIgnore(r io.Reader, base string) ([]ignoreRule, error) {
	var out []ignoreRule
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rule, ok, err := compileIgnore(sc.Text(), base)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, rule)
		}
	}
	return out, sc.Err()
}

// compileIgnore compiles one line; ok is false for blank lines and comments.
func compileIgnore(line, base string) (rule ignoreRule, ok bool, err error) {
	line = strings.TrimSuffix(line, "\r")
	// Trailing spaces go unless escaped.
	for strings.HasSuffix(line, " ") && !strings.HasSuffix(line, "\\ ") {
		line = line[:len(line)-1]
	}
	if line == "" || strings.HasPrefix(line, "#") {
		return rule, false, nil
	}
	rule.base = base
	if strings.HasPrefix(line, "!") {
		rule.negate = true
		line = line[1:]
	} else if strings.HasPrefix(line, `\!`) || strings.HasPrefix(line, `\#`) {
		line = line[1:]
	}
	if strings.HasSuffix(line, "/") {
		rule.dirOnly = true
		line = strings.TrimRight(line, "/")
	}
	if line == "" {
		return rule, false, nil
	}
	anchored := strings.Contains(line, "/")
	line = strings.TrimPrefix(line, "/")
	var b strings.Builder
	b.WriteString("^")
	if !anchored {
		b.WriteString("(?:.*/)?")
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch c {
		case '*':
			if i+1 < len(line) && line[i+1] == '*' && (i == 0 || line[i-1] == '/') {
				switch {
				case i+2 == len(line): // trailing "**": everything
					b.WriteString(".*")
					i++
					continue
				case line[i+2] == '/': // "**/": zero or more directories
					b.WriteString("(?:.*/)?")
					i += 2
					continue
				}
			}
			for i+1 < len(line) && line[i+1] == '*' {
				i++
			}
			b.WriteString("[^/]*")
		case '?':
			b.WriteString("[^/]")
		case '[':
			j := i + 1
			if j < len(line) && (line[j] == '!' || line[j] == '^') {
				j++
			}
			if j < len(line) && line[j] == ']' {
				j++
			}
			for j < len(line) && line[j] != ']' {
				j++
			}
			if j >= len(line) {
				b.WriteString(`\[`) // no closing bracket: a literal "["
				continue
			}
			class := line[i+1 : j]
			if strings.HasPrefix(class, "!") || strings.HasPrefix(class, "^") {
				class = "^" + class[1:]
			}
			class = strings.ReplaceAll(class, `\`, `\\`)
			class = strings.ReplaceAll(class, "[", `\[`)
			b.WriteString("[" + class + "]")
			i = j
		case '\\':
			if i+1 < len(line) {
				i++
				b.WriteString(regexp.QuoteMeta(string(line[i])))
			}
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	re, err := regexp.Compile(b.String())
	if err != nil {
		return rule, false, fmt.Errorf("ignore pattern %q: %w", line, err)
	}
	rule.re = re
	return rule, true, nil
}

// ignoreMatcher holds the rules that apply to one directory of a walk, in
// precedence order (lowest first).
type ignoreMatcher struct {
	rules []ignoreRule
	extra []ignoreRule
}

// child returns the matcher for directory dir (relative to the root), adding
// the rules of the ignore files it holds.
func (m *ignoreMatcher) child(root *os.Root, dir string) (*ignoreMatcher, error) {
	var add []ignoreRule
	for _, name := range []string{".gitignore", ".sandboxignore"} {
		p := path.Join(dir, name)
		data, err := readIgnoreFile(root, p)
		if err != nil {
			return nil, err
		}
		if data == nil {
			continue
		}
		rules, err := parseIgnore(bytes.NewReader(data), dir)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		add = append(add, rules...)
	}
	if len(add) == 0 {
		return m, nil
	}
	return &ignoreMatcher{rules: append(append([]ignoreRule(nil), m.rules...), add...), extra: m.extra}, nil
}

// MaxIgnoreFileBytes bounds an ignore file (.gitignore, .sandboxignore,
// .dockerignore).
const MaxIgnoreFileBytes = 1 << 20

// readIgnoreFile returns the content of the ignore file name (slash-separated,
// relative to root), or nil when there is none. The walker opens it for its
// own reasons and the tree may be hostile (a cloned repository's
// ".gitignore -> /etc/shadow", "-> /dev/zero", a FIFO): it must be a regular
// file, not a symlink even to one inside the tree (git reads its ignore files
// with O_NOFOLLOW too), of at most MaxIgnoreFileBytes; it is looked at before
// it is opened (a device is never opened), then opened without following a
// symlink or blocking and must be the file looked at. Anything else is an
// error naming the file: quietly dropping its rules could upload what they
// were meant to keep out.
func readIgnoreFile(root *os.Root, name string) ([]byte, error) {
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		kind := "a special file"
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			kind = "a symlink"
		case fi.IsDir():
			kind = "a directory"
		case fi.Mode()&fs.ModeNamedPipe != 0:
			kind = "a FIFO"
		}
		return nil, fmt.Errorf("read %s: is %s; ignore files are read only when they are regular files (replace it with a copy, or turn ignore files off)", name, kind)
	}
	if fi.Size() > MaxIgnoreFileBytes {
		return nil, fmt.Errorf("read %s: %d bytes, more than the %d an ignore file may hold", name, fi.Size(), MaxIgnoreFileBytes)
	}
	f, err := root.OpenFile(name, os.O_RDONLY|oNoFollow|oNonBlock, 0)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	defer f.Close()
	now, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if !now.Mode().IsRegular() || !os.SameFile(now, fi) {
		return nil, fmt.Errorf("read %s: replaced during the walk; not read", name)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxIgnoreFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(data) > MaxIgnoreFileBytes {
		return nil, fmt.Errorf("read %s: grew past the %d bytes an ignore file may hold", name, MaxIgnoreFileBytes)
	}
	return data, nil
}

// ignored reports whether rel (relative to the root) is excluded.
func (m *ignoreMatcher) ignored(rel string, isDir bool) bool {
	ign := false
	for _, set := range [][]ignoreRule{m.rules, m.extra} {
		for _, r := range set {
			if r.dirOnly && !isDir {
				continue
			}
			p := rel
			if r.base != "" {
				if !strings.HasPrefix(rel, r.base+"/") {
					continue
				}
				p = rel[len(r.base)+1:]
			}
			if r.re.MatchString(p) {
				ign = !r.negate
			}
		}
	}
	return ign
}
