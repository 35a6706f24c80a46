package builder

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// A Dockerfile is mapped onto a recipe, one step per instruction, so it is
// cached like any recipe: FROM is the recipe's from; RUN a run step (the
// ARGs in scope exported in front of it, as docker passes them); COPY and
// ADD copy steps made from the build context (see buildctx.go); ENV,
// WORKDIR, USER, ENTRYPOINT and CMD config steps. ARG declares build
// arguments (before FROM: usable in FROM only, as in docker). LABEL,
// EXPOSE, MAINTAINER and STOPSIGNAL are accepted and change nothing a
// sandbox uses. Everything else fails naming its line: multi-stage builds,
// COPY --from/--chown/--chmod, RUN --mount, ADD of URLs or archives,
// heredocs, ONBUILD, HEALTHCHECK, SHELL, VOLUME, a non-default escape.

// maxDockerfileBytes and maxInstructions bound a Dockerfile.
const (
	maxDockerfileBytes = 1 << 20
	maxInstructions    = 1000
)

var argNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// instruction is one logical line of a Dockerfile.
type instruction struct {
	line int    // 1-based line it starts on
	cmd  string // upper-cased
	args string // the rest, continuations joined
}

// dockerfileError is an error about a line, InvalidArgument.
func dockerfileError(line int, format string, a ...any) error {
	return fmt.Errorf("dockerfile line %d: %s: %w", line, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
}

// splitDockerfile splits src into instructions: comments and blank lines
// dropped, "\"-continued lines joined, parser directives checked.
func splitDockerfile(src string) ([]instruction, error) {
	if len(src) > maxDockerfileBytes {
		return nil, fmt.Errorf("dockerfile of %d bytes: more than %d: %w", len(src), maxDockerfileBytes, errdefs.ErrInvalidArgument)
	}
	if !utf8.ValidString(src) || strings.IndexByte(src, 0) >= 0 {
		return nil, fmt.Errorf("dockerfile: not valid UTF-8 text: %w", errdefs.ErrInvalidArgument)
	}
	lines := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	var out []instruction
	directives := true
	var cur *instruction
	var args strings.Builder // cur's arguments, continuations joined
	for i, raw := range lines {
		n := i + 1
		trimmed := strings.TrimSpace(raw)
		if strings.HasPrefix(trimmed, "#") {
			if directives && cur == nil {
				if k, v, ok := strings.Cut(strings.TrimSpace(trimmed[1:]), "="); ok && !strings.ContainsAny(strings.TrimSpace(k), " \t") {
					switch strings.ToLower(strings.TrimSpace(k)) {
					case "escape":
						if strings.TrimSpace(v) != `\` {
							return nil, dockerfileError(n, "escape=%s: only the default escape character \\ is supported", strings.TrimSpace(v))
						}
						continue
					case "syntax", "check":
						continue
					}
				}
			}
			directives = false
			continue // a comment, also between continued lines
		}
		directives = false
		if trimmed == "" {
			continue
		}
		cont := strings.HasSuffix(trimmed, `\`)
		part := strings.TrimSuffix(trimmed, `\`)
		if cur == nil {
			cmd, rest, _ := strings.Cut(part, " ")
			if t := strings.IndexByte(cmd, '\t'); t >= 0 {
				cmd, rest = cmd[:t], cmd[t+1:]+" "+rest
			}
			cur = &instruction{line: n, cmd: strings.ToUpper(cmd)}
			args.Reset()
			args.WriteString(strings.TrimSpace(rest))
		} else {
			args.WriteByte(' ')
			args.WriteString(strings.TrimSpace(part))
		}
		if !cont {
			cur.args = strings.TrimSpace(args.String())
			out = append(out, *cur)
			cur = nil
			if len(out) > maxInstructions {
				return nil, fmt.Errorf("dockerfile: more than %d instructions: %w", maxInstructions, errdefs.ErrInvalidArgument)
			}
		}
	}
	if cur != nil {
		cur.args = strings.TrimSpace(args.String())
		out = append(out, *cur)
	}
	return out, nil
}

// dfState is what a Dockerfile has set so far.
type dfState struct {
	buildArgs map[string]string // given with the request
	global    map[string]string // ARGs before FROM
	args      map[string]string // ARGs of the stage, with values
	argOrder  []string
	env       map[string]string // ENV of the stage
	workdir   string
	from      bool
	bc        *buildContext
	recipe    *sbxv1.Recipe
}

// DockerfileRecipe turns a Dockerfile and its build context (a tar) into a
// recipe; buildArgs set ARGs. Errors are InvalidArgument and name the line.
func DockerfileRecipe(src string, context []byte, buildArgs map[string]string) (*sbxv1.Recipe, error) {
	for k := range buildArgs {
		if !argNameRe.MatchString(k) {
			return nil, fmt.Errorf("build arg %s: not a name: %w", quoteName(k), errdefs.ErrInvalidArgument)
		}
	}
	ins, err := splitDockerfile(src)
	if err != nil {
		return nil, err
	}
	bc, err := readContext(context)
	if err != nil {
		return nil, err
	}
	st := &dfState{buildArgs: buildArgs, global: map[string]string{}, args: map[string]string{},
		env: map[string]string{}, workdir: "/", bc: bc, recipe: &sbxv1.Recipe{}}
	for _, in := range ins {
		if err := st.apply(in); err != nil {
			return nil, err
		}
	}
	if !st.from {
		return nil, fmt.Errorf("dockerfile: no FROM: %w", errdefs.ErrInvalidArgument)
	}
	return st.recipe, nil
}

func (st *dfState) add(s *sbxv1.RecipeStep) { st.recipe.Steps = append(st.recipe.Steps, s) }

// vars are the values $NAME expands to: ARGs, then ENV over them.
func (st *dfState) vars() map[string]string {
	v := maps.Clone(st.args)
	maps.Copy(v, st.env)
	return v
}

// flags strips leading --flag[=value] words from args and returns them.
func flags(args string) (map[string]string, string) {
	f := map[string]string{}
	for strings.HasPrefix(args, "--") {
		word, rest, _ := strings.Cut(args, " ")
		k, v, _ := strings.Cut(strings.TrimPrefix(word, "--"), "=")
		f[k] = v
		args = strings.TrimSpace(rest)
	}
	return f, args
}

func (st *dfState) apply(in instruction) error {
	n := in.line
	if !st.from && in.cmd != "FROM" && in.cmd != "ARG" {
		return dockerfileError(n, "%s before FROM", in.cmd)
	}
	if strings.Contains(in.args, "<<") && (in.cmd == "RUN" || in.cmd == "COPY" || in.cmd == "ADD") && heredocRe.MatchString(in.args) {
		return dockerfileError(n, "heredocs (<<EOF) are not supported")
	}
	switch in.cmd {
	case "FROM":
		return st.fromInstr(in)
	case "ARG":
		return st.argInstr(in)
	case "RUN":
		fl, args := flags(in.args)
		if len(fl) > 0 {
			return dockerfileError(n, "RUN --%s is not supported", slices.Sorted(maps.Keys(fl))[0])
		}
		cmd, err := shellOrExec(args)
		if err != nil {
			return dockerfileError(n, "RUN: %v", err)
		}
		if cmd == "" {
			return dockerfileError(n, "RUN: no command")
		}
		st.add(&sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Run{Run: st.argPrefix() + cmd}})
	case "COPY", "ADD":
		return st.copyInstr(in)
	case "ENV":
		kvs, err := keyValues(in.args, true)
		if err != nil {
			return dockerfileError(n, "ENV: %v", err)
		}
		env := map[string]string{}
		for _, kv := range kvs {
			v, err := expand(kv[1], st.vars())
			if err != nil {
				return dockerfileError(n, "ENV %s: %v", kv[0], err)
			}
			st.env[kv[0]], env[kv[0]] = v, v
		}
		st.add(&sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Env{Env: &sbxv1.EnvStep{Env: env}}})
	case "WORKDIR":
		w, err := expand(in.args, st.vars())
		if err != nil || w == "" {
			return dockerfileError(n, "WORKDIR: want a path (%v)", err)
		}
		if !path.IsAbs(w) {
			w = path.Join(st.workdir, w)
		}
		st.workdir = path.Clean(w)
		st.add(&sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Workdir{Workdir: st.workdir}})
	case "USER":
		u, err := expand(in.args, st.vars())
		if err != nil || u == "" || strings.ContainsAny(u, " \t") {
			return dockerfileError(n, "USER: want one user[:group] (%v)", err)
		}
		st.add(&sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_User{User: u}})
	case "ENTRYPOINT", "CMD":
		v, err := commandForm(in.args)
		if err != nil {
			return dockerfileError(n, "%s: %v", in.cmd, err)
		}
		if in.cmd == "CMD" {
			st.add(&sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Cmd{Cmd: &sbxv1.StringList{Values: v}}})
		} else {
			st.add(&sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Entrypoint{Entrypoint: &sbxv1.StringList{Values: v}}})
		}
	case "LABEL", "EXPOSE", "MAINTAINER", "STOPSIGNAL":
		// Accepted; nothing a sandbox uses.
	case "ONBUILD", "HEALTHCHECK", "SHELL", "VOLUME":
		return dockerfileError(n, "%s is not supported", in.cmd)
	default:
		return dockerfileError(n, "unknown instruction %s", quoteName(in.cmd))
	}
	return nil
}

var heredocRe = regexp.MustCompile(`(^|[ \t])<<-?["']?[A-Za-z_][A-Za-z0-9_]*["']?`)

func (st *dfState) fromInstr(in instruction) error {
	n := in.line
	if st.from {
		return dockerfileError(n, "a second FROM: multi-stage builds are not supported")
	}
	fl, args := flags(in.args)
	if p, ok := fl["platform"]; ok && len(fl) == 1 && p != "linux/amd64" && p != "linux/arm64" {
		return dockerfileError(n, "FROM --platform=%s: only this host's platform can be built", p)
	}
	for k := range fl {
		if k != "platform" {
			return dockerfileError(n, "FROM --%s is not supported", k)
		}
	}
	fields := strings.Fields(args)
	if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
		fields = fields[:1] // a stage name alone is harmless
	}
	if len(fields) != 1 {
		return dockerfileError(n, "FROM: want one image (FROM image [AS name])")
	}
	ref, err := expand(fields[0], st.global)
	if err != nil || ref == "" {
		return dockerfileError(n, "FROM %s: %v", fields[0], err)
	}
	if ref == "scratch" {
		return dockerfileError(n, "FROM scratch is not supported (a sandbox needs a shell); use FROM debian:bookworm")
	}
	st.from = true
	st.recipe.From = ref
	return nil
}

func (st *dfState) argInstr(in instruction) error {
	kvs, err := keyValues(in.args, false)
	if err != nil {
		return dockerfileError(in.line, "ARG: %v", err)
	}
	for _, kv := range kvs {
		k, def, hasDef := kv[0], kv[1], kv[2] == "="
		if !st.from {
			v := def
			if b, ok := st.buildArgs[k]; ok {
				v = b
			} else if hasDef {
				if v, err = expand(def, st.global); err != nil {
					return dockerfileError(in.line, "ARG %s: %v", k, err)
				}
			}
			st.global[k] = v
			continue
		}
		v, ok := st.buildArgs[k]
		if !ok {
			if g, isGlobal := st.global[k]; isGlobal && !hasDef {
				v, ok = g, true
			} else if hasDef {
				if v, err = expand(def, st.vars()); err != nil {
					return dockerfileError(in.line, "ARG %s: %v", k, err)
				}
				ok = true
			}
		}
		if !ok {
			continue // declared without a value: unset
		}
		if _, seen := st.args[k]; !seen {
			st.argOrder = append(st.argOrder, k)
		}
		st.args[k] = v
	}
	return nil
}

// argPrefix exports the stage's ARGs for a RUN (ENV wins over an ARG of
// the same name, as in docker).
func (st *dfState) argPrefix() string {
	var b strings.Builder
	for _, k := range st.argOrder {
		if _, isEnv := st.env[k]; isEnv {
			continue
		}
		fmt.Fprintf(&b, "export %s=%s; ", k, shellQuote(st.args[k]))
	}
	return b.String()
}

var archiveSuffixes = []string{".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"}

func (st *dfState) copyInstr(in instruction) error {
	n := in.line
	fl, args := flags(in.args)
	for k := range fl {
		return dockerfileError(n, "%s --%s is not supported (files are copied owned by root; use a RUN step to change them)", in.cmd, k)
	}
	var words []string
	if err := json.Unmarshal([]byte(args), &words); err != nil || !strings.HasPrefix(args, "[") {
		if words, err = splitWords(args); err != nil {
			return dockerfileError(n, "%s: %v", in.cmd, err)
		}
	}
	var err error
	if len(words) < 2 {
		return dockerfileError(n, "%s: want one or more sources and a destination", in.cmd)
	}
	for i, w := range words {
		if words[i], err = expand(w, st.vars()); err != nil {
			return dockerfileError(n, "%s %s: %v", in.cmd, w, err)
		}
	}
	srcs, dest := words[:len(words)-1], words[len(words)-1]
	if in.cmd == "ADD" {
		for _, s := range srcs {
			if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
				return dockerfileError(n, "ADD %s: only local files can be added (download with a RUN step)", quoteName(s))
			}
			for _, suf := range archiveSuffixes {
				if strings.HasSuffix(strings.ToLower(s), suf) {
					return dockerfileError(n, "ADD %s: ADD would unpack this archive, which is not supported; COPY it and unpack it with a RUN step", quoteName(s))
				}
			}
		}
	}
	destDir := strings.HasSuffix(dest, "/") || dest == "." || strings.HasSuffix(dest, "/.")
	if !path.IsAbs(dest) {
		dest = path.Join(st.workdir, dest)
	}
	dest = path.Clean(dest)
	var entries []copyEntry
	for _, s := range srcs {
		es, single, err := st.bc.resolve(s)
		if err != nil {
			return dockerfileError(n, "%s: %v", in.cmd, err)
		}
		if !single || isGlob(s) {
			destDir = destDir || len(srcs) > 1 || isGlob(s)
		}
		if single && len(srcs) == 1 && !isGlob(s) && !destDir {
			// COPY file /path/name: the file lands as /path/name.
			es[0].name = path.Base(dest)
			dest = path.Dir(dest)
		}
		entries = append(entries, es...)
	}
	if len(srcs) > 1 && !strings.HasSuffix(words[len(words)-1], "/") {
		return dockerfileError(n, "%s with several sources: the destination must end with /", in.cmd)
	}
	data, err := st.bc.copyTar(entries)
	if err != nil {
		return fmt.Errorf("dockerfile line %d: %w", n, err)
	}
	st.add(&sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Copy{Copy: &sbxv1.CopyStep{Dest: dest, Tar: data}}})
	return nil
}

// commandForm parses an exec-form JSON array, or takes the text as a
// shell command ["/bin/sh", "-c", text].
func commandForm(args string) ([]string, error) {
	if strings.HasPrefix(args, "[") {
		var v []string
		if err := json.Unmarshal([]byte(args), &v); err == nil {
			return v, nil
		}
	}
	if args == "" {
		return nil, fmt.Errorf("empty")
	}
	return []string{"/bin/sh", "-c", args}, nil
}

// shellOrExec returns a RUN's shell command: the text, or an exec-form
// array quoted into one.
func shellOrExec(args string) (string, error) {
	if strings.HasPrefix(args, "[") {
		var v []string
		if err := json.Unmarshal([]byte(args), &v); err == nil {
			if len(v) == 0 {
				return "", fmt.Errorf("empty exec form")
			}
			q := make([]string, len(v))
			for i, w := range v {
				q[i] = shellQuote(w)
			}
			return "exec " + strings.Join(q, " "), nil
		}
	}
	return args, nil
}

// keyValues parses "K=V K2='v 2'" (and, with legacy, "K rest of line");
// each result is {key, value, "=" if a value was given}.
func keyValues(args string, legacy bool) ([][3]string, error) {
	words, err := splitWords(args)
	if err != nil {
		return nil, err
	}
	if len(words) == 0 {
		return nil, fmt.Errorf("want NAME=value")
	}
	if legacy && !strings.Contains(words[0], "=") {
		k, v, _ := strings.Cut(strings.TrimSpace(args), " ")
		if !argNameRe.MatchString(k) {
			return nil, fmt.Errorf("%s: not a variable name", quoteName(k))
		}
		w, err := splitWords(v)
		if err != nil {
			return nil, err
		}
		return [][3]string{{k, strings.Join(w, " "), "="}}, nil
	}
	var out [][3]string
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !argNameRe.MatchString(k) {
			return nil, fmt.Errorf("%s: not a variable name", quoteName(k))
		}
		if legacy && !ok {
			return nil, fmt.Errorf("%s: want NAME=value", quoteName(w))
		}
		eq := ""
		if ok {
			eq = "="
		}
		out = append(out, [3]string{k, v, eq})
	}
	return out, nil
}

// splitWords splits on blanks outside quotes, removing quotes and
// backslash escapes ("$" stays escaped as "\$" for expand).
func splitWords(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in := false
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == 0 && (c == ' ' || c == '\t'):
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
			continue
		case c == '\\' && quote != '\'' && i+1 < len(s):
			i++
			if s[i] == '$' {
				cur.WriteByte('\\')
			}
			cur.WriteByte(s[i])
		case (c == '"' || c == '\'') && quote == 0:
			quote = c
		case c == quote:
			quote = 0
		case c == '$' && quote == '\'':
			cur.WriteString(`\$`)
		default:
			cur.WriteByte(c)
		}
		in = true
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if in {
		out = append(out, cur.String())
	}
	return out, nil
}

// expand replaces $NAME, ${NAME}, ${NAME:-default} and ${NAME:+alt} with
// vars; "\$" is a literal "$".
func expand(s string, vars map[string]string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if c != '$' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		if s[i+1] == '{' {
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 {
				return "", fmt.Errorf("unterminated ${ in %s", quoteName(s))
			}
			expr := s[i+2 : i+2+end]
			i += 2 + end
			name, word, op := expr, "", ""
			if j := strings.Index(expr, ":"); j >= 0 && j+1 < len(expr) && (expr[j+1] == '-' || expr[j+1] == '+') {
				name, op, word = expr[:j], expr[j:j+2], expr[j+2:]
			}
			if !argNameRe.MatchString(name) {
				return "", fmt.Errorf("bad substitution ${%s}", expr)
			}
			v, set := vars[name]
			switch {
			case op == ":-" && v == "":
				v = word
			case op == ":+" && set && v != "":
				v = word
			case op == ":+":
				v = ""
			}
			b.WriteString(v)
			continue
		}
		j := i + 1
		for j < len(s) && (s[j] == '_' || 'a' <= s[j] && s[j] <= 'z' || 'A' <= s[j] && s[j] <= 'Z' || j > i+1 && '0' <= s[j] && s[j] <= '9') {
			j++
		}
		if j == i+1 {
			b.WriteByte('$')
			continue
		}
		b.WriteString(vars[s[i+1:j]])
		i = j - 1
	}
	return b.String(), nil
}
