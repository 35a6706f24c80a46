package cli

import (
	"fmt"
	"os"
	"strings"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// parseSecretFor parses --secret-for values: NAME=VALUE@domain,domain or
// NAME@domain,... whose value is the CLI's own $NAME (so it stays out of
// shell history). The domains follow the last "@": values may contain "@".
func parseSecretFor(in []string) ([]sbx.DomainSecret, error) {
	return parseSecretForEnv(in, os.LookupEnv)
}

func parseSecretForEnv(in []string, lookupEnv func(string) (string, bool)) ([]sbx.DomainSecret, error) {
	var out []sbx.DomainSecret
	for _, s := range in {
		i := strings.LastIndexByte(s, '@')
		if i < 0 {
			return nil, fmt.Errorf("--secret-for %q: want NAME=VALUE@domain[,domain...] or NAME@domain[,...]", redact(s))
		}
		left, domains := s[:i], strings.Split(s[i+1:], ",")
		name, value, hasValue := strings.Cut(left, "=")
		if name == "" {
			return nil, fmt.Errorf("--secret-for %q: no name", redact(s))
		}
		if !hasValue {
			v, ok := lookupEnv(name)
			if !ok {
				return nil, fmt.Errorf("--secret-for %s@...: no value given and $%s is not set", name, name)
			}
			value = v
		}
		var ds []string
		for _, d := range domains {
			if d = strings.TrimSpace(d); d != "" {
				ds = append(ds, d)
			}
		}
		if len(ds) == 0 {
			return nil, fmt.Errorf("--secret-for %s: no domains after \"@\"", name)
		}
		out = append(out, sbx.DomainSecret{Name: name, Value: value, Domains: ds})
	}
	return out, nil
}

// redact hides a secret's value in error messages.
func redact(s string) string {
	name, _, ok := strings.Cut(s, "=")
	if !ok {
		return s
	}
	return name + "=…"
}
