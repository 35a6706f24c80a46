package cli

import (
	"fmt"
	"os"
	"strings"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// secretForSyntax is the --secret-for syntax, for errors and help.
const secretForSyntax = "NAME[=VALUE]@HOST[,HOST...][;header=NAME[,NAME...]][;query]"

// secretForHelp documents --secret-for.
const secretForHelp = "domain secret " + secretForSyntax + ": the sandbox sees a placeholder " +
	"(sbx-secret-<name>-<random>) in $NAME; the egress proxy puts VALUE in its place only in HTTPS requests to " +
	"those hosts (*.host: names below host), and there only in the Authorization header, or in the headers " +
	"named with ;header=, and in the URL query only with ;query. Plain HTTP requests carrying the placeholder " +
	"to those hosts are refused. Without =VALUE the value is this shell's $NAME (kept out of shell history). " +
	"A host that echoes request headers hands the value back: name only hosts you trust. Repeatable; quote " +
	"it (';' is special to the shell), e.g. 'API_KEY@api.example.com;header=X-Api-Key'"

// parseSecretFor parses --secret-for values (secretForSyntax). The hosts
// and options follow the last "@": values may contain "@" and ";".
func parseSecretFor(in []string) ([]sbx.DomainSecret, error) {
	return parseSecretForEnv(in, os.LookupEnv)
}

func parseSecretForEnv(in []string, lookupEnv func(string) (string, bool)) ([]sbx.DomainSecret, error) {
	var out []sbx.DomainSecret
	for _, s := range in {
		i := strings.LastIndexByte(s, '@')
		if i < 0 {
			return nil, fmt.Errorf("--secret-for %q: want %s", redact(s), secretForSyntax)
		}
		left, rest := s[:i], s[i+1:]
		name, value, hasValue := strings.Cut(left, "=")
		if name == "" {
			return nil, fmt.Errorf("--secret-for %q: no name", redact(s))
		}
		opts := strings.Split(rest, ";")
		d := sbx.DomainSecret{Name: name, Domains: splitList(opts[0])}
		if len(d.Domains) == 0 {
			return nil, fmt.Errorf("--secret-for %s: no hosts after \"@\"", name)
		}
		for _, o := range opts[1:] {
			key, val, _ := strings.Cut(strings.TrimSpace(o), "=")
			switch strings.ToLower(key) {
			case "header":
				hs := splitList(val)
				if len(hs) == 0 {
					return nil, fmt.Errorf("--secret-for %s: \"header=\" names no header", name)
				}
				d.Headers = append(d.Headers, hs...)
			case "query":
				if val != "" {
					return nil, fmt.Errorf("--secret-for %s: \"query\" takes no value", name)
				}
				d.AllowQuery = true
			case "":
				// an empty option (trailing ";")
			default:
				return nil, fmt.Errorf("--secret-for %s: unknown option %q after the hosts: want header=NAME[,NAME...] or query", name, key)
			}
		}
		if !hasValue {
			v, ok := lookupEnv(name)
			if !ok {
				return nil, fmt.Errorf("--secret-for %s@...: no value given and $%s is not set", name, name)
			}
			value = v
		}
		d.Value = value
		out = append(out, d)
	}
	return out, nil
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// redact hides a secret's value in error messages.
func redact(s string) string {
	name, _, ok := strings.Cut(s, "=")
	if !ok {
		return s
	}
	return name + "=…"
}
