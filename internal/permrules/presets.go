package permrules

import (
	"slices"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// preset is a default permission plus rules; a policy's own rules extend it.
type preset struct {
	def   Perm
	rules []*sbxv1.PermissionRule
}

// hidePriority is the priority of the presets' hiding rules: above their
// other rules, so /output/x.key stays hidden under agent-safe. A user rule
// with a higher priority can still expose such a path.
const hidePriority = 100

const (
	globType = sbxv1.PatternType_PATTERN_TYPE_GLOB
	dirType  = sbxv1.PatternType_PATTERN_TYPE_DIRECTORY
)

// secretPatterns are the files and directories agent-safe and development
// hide, at any depth (a pattern with "/" starts with "**/") and whatever
// their case. docs/ARCHITECTURE.md lists them in one table (a test checks
// it stays complete); keep the two in step.
var secretPatterns = []struct {
	pattern string
	typ     sbxv1.PatternType
}{
	// Environment files and secret stores of applications.
	{".env*", globType}, {"secrets", dirType}, {"secrets.*", globType}, {"credentials*", globType},
	// Private keys, certificates with keys, key stores, password databases.
	{"*.key", globType}, {"*.pem", globType}, {"*.p12", globType}, {"*.pfx", globType}, {"*.p8", globType},
	{"*.jks", globType}, {"*.keystore", globType}, {"*.ppk", globType}, {"*.kdbx", globType},
	// SSH and GnuPG: the whole directories, and private keys found elsewhere
	// under their usual names (their .pub halves stay readable).
	{".ssh", dirType}, {".gnupg", dirType},
	{"id_rsa", globType}, {"id_dsa", globType}, {"id_ecdsa", globType}, {"id_ed25519", globType},
	{"id_ecdsa_sk", globType}, {"id_ed25519_sk", globType},
	// Credentials of clients: HTTP, package registries, git, databases.
	{".netrc", globType}, {"_netrc", globType}, {".npmrc", globType}, {".pypirc", globType},
	{".git-credentials", globType}, {".gitcookies", globType}, {".pgpass", globType}, {".my.cnf", globType},
	{".htpasswd", globType},
	// Clouds, containers, orchestration, infrastructure as code.
	{".aws", dirType}, {".azure", dirType}, {"**/.config/gcloud", globType}, {".s3cfg", globType}, {".boto", globType},
	{"**/.docker/config.json", globType}, {".dockercfg", globType},
	{"**/.kube/config", globType}, {"kubeconfig", globType}, {"*.kubeconfig", globType},
	{".vault-token", globType}, {".terraformrc", globType}, {"*.tfstate", globType}, {"*.tfstate.*", globType},
}

// hide is a preset's hiding rule: NONE, at hidePriority, case-insensitive.
func hide(pat string, typ sbxv1.PatternType) *sbxv1.PermissionRule {
	return &sbxv1.PermissionRule{Pattern: pat, Type: typ, Permission: sbxv1.Permission_PERMISSION_NONE,
		Priority: hidePriority, CaseInsensitive: true}
}

// secretRules hide secretPatterns.
func secretRules() []*sbxv1.PermissionRule {
	out := make([]*sbxv1.PermissionRule, 0, len(secretPatterns))
	for _, s := range secretPatterns {
		out = append(out, hide(s.pattern, s.typ))
	}
	return out
}

var presets = map[string]preset{
	// Browse names and metadata, read nothing.
	"view-only": {def: View},
	// Read everything, change nothing.
	"read-only": {def: Read},
	// Read everything but secrets and .git, write only /output and /tmp.
	"agent-safe": {def: Read, rules: append(secretRules(),
		hide(".git", dirType),
		&sbxv1.PermissionRule{Pattern: "/output", Type: dirType, Permission: sbxv1.Permission_PERMISSION_WRITE, Priority: 10},
		&sbxv1.PermissionRule{Pattern: "/tmp", Type: dirType, Permission: sbxv1.Permission_PERMISSION_WRITE, Priority: 10},
	)},
	// Read and write everything (.git included: commits work) but secrets,
	// which stay hidden.
	"development": {def: Write, rules: secretRules()},
	// No restriction (useful as a base for a few rules).
	"full-access": {def: Write},
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
