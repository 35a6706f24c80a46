package permrules

import (
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// BenchmarkDecideAgentSafe is the agent's cost of one FUSE lookup under the
// agent-safe preset (the secret rules are case-insensitive).
func BenchmarkDecideAgentSafe(b *testing.B) {
	p, err := Compile(&sbxv1.PathPolicy{Path: "/workspace", Preset: "agent-safe"})
	if err != nil {
		b.Fatal(err)
	}
	for _, path := range []string{"/README.md", "/src/pkg/internal/server/handler.go"} {
		b.Run(path, func(b *testing.B) {
			for b.Loop() {
				p.Decide(path, false)
			}
		})
	}
}
