package cli

import (
	"bytes"
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Recipes in YAML look like this (each step is a map with one key):
//
//	from: debian:bookworm
//	steps:
//	  - apt_install: [python3, python3-pip]     # or "python3 python3-pip"
//	  - pip_install: [requests]
//	  - npm_install: [typescript]
//	  - run: make install
//	  - copy: {src: ./app, dest: /app}          # src inside the build context
//	  - env: {APP_ENV: prod}
//	  - workdir: /app
//	  - entrypoint: [python3]
//	  - cmd: [main.py]
//	  - user: app
//	  - python: "3.11"                          # from the image's apt sources
//
// A copy's src is a relative path inside the build context (the recipe
// file's directory unless `sbx build --context DIR`; see buildcontext.go):
// a directory is copied with its contents into dest; a single file lands in
// the directory dest. Symlinks are never followed: those pointing inside
// what is copied are copied as links, others are refused. Files are owned
// by root in the image.

type yamlRecipe struct {
	From  string                 `yaml:"from"`
	Steps []map[string]yaml.Node `yaml:"steps"`
}

// maxCopyBytes bounds what copy steps of one recipe may send.
const maxCopyBytes = 1 << 30

// parseRecipe reads a YAML recipe; contextDir is the build context, the
// only directory copy steps may read.
func parseRecipe(data []byte, contextDir string) (*sbxv1.Recipe, error) {
	var y yamlRecipe
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&y); err != nil {
		return nil, fmt.Errorf("recipe: %w", err)
	}
	if y.From == "" {
		return nil, fmt.Errorf("recipe: `from` is missing")
	}
	r := &sbxv1.Recipe{From: y.From}
	bc := &buildContext{dir: contextDir}
	defer bc.Close()
	for i, m := range y.Steps {
		if len(m) != 1 {
			return nil, fmt.Errorf("recipe step %d: want exactly one of apt_install, pip_install, npm_install, python, run, copy, env, workdir, entrypoint, cmd, user; got %d keys", i+1, len(m))
		}
		for k, n := range m {
			s, err := parseStep(k, &n, bc)
			if err != nil {
				return nil, fmt.Errorf("recipe step %d (%s): %w", i+1, k, err)
			}
			r.Steps = append(r.Steps, s)
		}
	}
	return r, nil
}

func parseStep(kind string, n *yaml.Node, bc *buildContext) (*sbxv1.RecipeStep, error) {
	str := func() (string, error) {
		var s string
		if err := n.Decode(&s); err != nil || s == "" {
			return "", fmt.Errorf("want a non-empty string (line %d)", n.Line)
		}
		return s, nil
	}
	list := func() ([]string, error) {
		var l []string
		if n.Kind == yaml.ScalarNode {
			var s string
			if err := n.Decode(&s); err != nil {
				return nil, err
			}
			l = strings.Fields(s)
		} else if err := n.Decode(&l); err != nil {
			return nil, fmt.Errorf("want a list of strings (line %d)", n.Line)
		}
		if len(l) == 0 {
			return nil, fmt.Errorf("empty list (line %d)", n.Line)
		}
		return l, nil
	}
	switch kind {
	case "apt_install", "pip_install", "npm_install":
		pkgs, err := list()
		if err != nil {
			return nil, err
		}
		pl := &sbxv1.PackageList{Packages: pkgs}
		switch kind {
		case "apt_install":
			return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_AptInstall{AptInstall: pl}}, nil
		case "pip_install":
			return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_PipInstall{PipInstall: pl}}, nil
		}
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_NpmInstall{NpmInstall: pl}}, nil
	case "run":
		s, err := str()
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Run{Run: s}}, err
	case "workdir":
		s, err := str()
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Workdir{Workdir: s}}, err
	case "user":
		s, err := str()
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_User{User: s}}, err
	case "python":
		s, err := str()
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Python{Python: s}}, err
	case "entrypoint", "cmd":
		var l []string
		if err := n.Decode(&l); err != nil {
			return nil, fmt.Errorf("want a list of strings (line %d)", n.Line)
		}
		if kind == "cmd" {
			return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Cmd{Cmd: &sbxv1.StringList{Values: l}}}, nil
		}
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Entrypoint{Entrypoint: &sbxv1.StringList{Values: l}}}, nil
	case "env":
		var m map[string]string
		if err := n.Decode(&m); err != nil || len(m) == 0 {
			return nil, fmt.Errorf("want a map of NAME: value (line %d)", n.Line)
		}
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Env{Env: &sbxv1.EnvStep{Env: m}}}, nil
	case "copy":
		var c struct {
			Src  string `yaml:"src"`
			Dest string `yaml:"dest"`
		}
		if err := n.Decode(&c); err != nil || c.Src == "" || c.Dest == "" {
			return nil, fmt.Errorf("want {src: PATH_IN_BUILD_CONTEXT, dest: /ABSOLUTE/DIR} (line %d)", n.Line)
		}
		src, err := checkCopySrc(c.Src)
		if err != nil {
			return nil, err
		}
		data, err := bc.tar(src)
		if err != nil {
			return nil, err
		}
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Copy{Copy: &sbxv1.CopyStep{Dest: c.Dest, Tar: data}}}, nil
	}
	return nil, fmt.Errorf("unknown step (want apt_install, pip_install, npm_install, python, run, copy, env, workdir, entrypoint, cmd or user)")
}
